/* Where a JPEG decode's time goes, by libjpeg-turbo setting: the C-level profile behind the
 * "Decode work per image" section of docs/throughput.md. Not part of the package.
 *
 *   cc -O2 -o /tmp/decode_profile benchmarks/decode_profile.c -ljpeg
 *   taskset -c 1 /tmp/decode_profile $(find DIR -name "*.JPEG")   # DIR: a dataset_bench.synth folder
 *
 * Prints, per setting, the best of 3 passes in CPU ms per image (CLOCK_PROCESS_CPUTIME_ID):
 * full decode to RGB (accurate integer IDCT, fancy upsampling: the readers' settings), entropy
 * decoding alone (jpeg_read_coefficients), output in YCbCr (no colour conversion), no fancy
 * upsampling, every M/8 DCT scale, and regions (jpeg_skip_scanlines + jpeg_crop_scanline, the
 * decode stopped after the region's last row).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <jpeglib.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_PROCESS_CPUTIME_ID,&t);return t.tv_sec+t.tv_nsec*1e-9;}
typedef struct {unsigned char*d; unsigned long n;} blob;
static unsigned char outbuf[8192 * 8192 * 3];
/* mode: 0 full, 1 coeffs only, 2 ycbcr out, 3 nofancy, 4 crop; scale M/8 */
static void dec(blob*b,int mode,int M,double fy0,double fy1,double fx0,double fx1){
  struct jpeg_decompress_struct c; struct jpeg_error_mgr e;
  c.err=jpeg_std_error(&e); jpeg_create_decompress(&c);
  jpeg_mem_src(&c,b->d,b->n); jpeg_read_header(&c,TRUE);
  if(mode==1){jpeg_read_coefficients(&c); jpeg_destroy_decompress(&c); return;}
  c.dct_method=JDCT_ISLOW; c.do_fancy_upsampling=(mode==3)?FALSE:TRUE;
  c.out_color_space=(mode==2)?JCS_YCbCr:JCS_RGB;
  if(c.jpeg_color_space==JCS_GRAYSCALE) c.out_color_space=JCS_GRAYSCALE;
  c.scale_num=M; c.scale_denom=8;
  jpeg_start_decompress(&c);
  JDIMENSION W=c.output_width,H=c.output_height;
  JDIMENSION y0=0,y1=H;
  if(mode==4){
    JDIMENSION x0=(JDIMENSION)(fx0*W), w=(JDIMENSION)((fx1-fx0)*W);
    jpeg_crop_scanline(&c,&x0,&w);
    y0=(JDIMENSION)(fy0*H); y1=(JDIMENSION)(fy1*H);
    if(y0) jpeg_skip_scanlines(&c,y0);
  }
  JDIMENSION stride=c.output_width*c.output_components;
  while(c.output_scanline<y1){JSAMPROW r=outbuf+(size_t)c.output_scanline*stride; jpeg_read_scanlines(&c,&r,1);}
  if(mode==4 && y1<H) jpeg_abort_decompress(&c); else jpeg_finish_decompress(&c);
  jpeg_destroy_decompress(&c);
}
int main(int argc,char**argv){
  int n=argc-1;
  if(n<1){fprintf(stderr,"usage: %s FILE.jpg...\n",argv[0]);return 2;} blob*bs=malloc(n*sizeof(blob));
  for(int i=0;i<n;i++){FILE*f=fopen(argv[i+1],"rb"); if(!f){perror(argv[i+1]);return 1;}fseek(f,0,2);bs[i].n=ftell(f);fseek(f,0,0);bs[i].d=malloc(bs[i].n);if(fread(bs[i].d,1,bs[i].n,f)!=bs[i].n){fprintf(stderr,"%s: short read\n",argv[i+1]);return 1;}fclose(f);}
  struct {const char*name;int mode,M;double y0,y1,x0,x1;} cases[]={
    {"full RGB 8/8",0,8},{"entropy only (read_coefficients)",1,8},{"full -> YCbCr (no color conv)",2,8},{"full, no fancy upsample",3,8},
    {"scale 7/8",0,7},{"scale 6/8",0,6},{"scale 5/8",0,5},{"scale 4/8",0,4},{"scale 3/8",0,3},{"scale 2/8",0,2},{"scale 1/8",0,1},
    {"crop center 87.5% (eval)",4,8,0.0625,0.9375,0.0625,0.9375},
    {"crop 70.7% x 70.7% center (area 1/2)",4,8,0.146,0.854,0.146,0.854},
    {"crop 50x50% top-left",4,8,0,0.5,0,0.5},
    {"crop 50x50% bottom-right",4,8,0.5,1,0.5,1},
    {"crop 28x28% (area 0.08) center",4,8,0.36,0.64,0.36,0.64},
  };
  int nc=sizeof cases/sizeof cases[0];
  double base=0;
  for(int k=0;k<nc;k++){
    double best=1e9;
    for(int rep=0;rep<3;rep++){double t=now(); for(int i=0;i<n;i++) dec(&bs[i],cases[k].mode,cases[k].M,cases[k].y0,cases[k].y1,cases[k].x0,cases[k].x1); t=now()-t; if(t<best)best=t;}
    double ms=best/n*1e3; if(k==0)base=ms;
    printf("%-40s %6.3f ms/img  %6.0f img/s  %.2fx of full\n",cases[k].name,ms,1e3/ms,ms/base);
  }
}

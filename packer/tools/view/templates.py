"""The view's jinja2 templates and style sheet (inline: every page is one self-contained response).

No script, no external stylesheet, font or image: thumbnails are ``data:`` URIs, the chart an inline
SVG, the filters a plain GET form.
"""

from __future__ import annotations

from jinja2 import DictLoader, Environment, select_autoescape

__all__ = ["ENV", "CSS"]

CSS = """body{font:14px system-ui,sans-serif;margin:1em 2em;color:#222}nav a{margin-right:1em}
table{border-collapse:collapse;margin:.3em 0}td,th{border:1px solid #ccc;padding:2px 6px;text-align:left;
vertical-align:top}.grid{display:flex;flex-wrap:wrap;gap:8px}.cell{width:160px;font-size:12px;overflow:hidden}
.cell img{max-width:160px;max-height:160px;display:block}.err{color:#b00;font-size:11px;word-break:break-all}
.stage{position:relative;display:inline-block;line-height:0}.stage img{display:block;max-width:none}
.box{position:absolute;border:2px solid #f0f;box-sizing:border-box}.box span{background:#f0f;color:#fff;
font-size:11px;line-height:14px;position:absolute;top:-16px;left:-2px;padding:0 2px;white-space:nowrap}
pre{margin:0;white-space:pre-wrap}.summary{font-family:monospace}form{margin:.5em 0}"""

_TEMPLATES = {
    "base.html": """<!doctype html><html><head><meta charset="utf-8"><title>{{ title }}</title>
<style>{{ css }}</style></head><body>
{% if nav %}<nav><a href="/{{ q }}">overview</a><a href="/grid{{ q }}">grid</a><a href="/rejects{{ q }}">rejects</a>
</nav>{% endif %}
{% block body %}{% endblock %}</body></html>""",
    "overview.html": """{% extends "base.html" %}{% block body %}
<h1 id="path">{{ path }}</h1>
{% for s in splits %}<section class="split" data-split="{{ s.name }}"><h2>{{ s.name }}</h2>
<table><tr><th>format</th><td class="format">{{ s.desc.format }}</td></tr>
<tr><th>samples</th><td class="samples">{{ s.desc.samples }}</td></tr>
<tr><th>classes</th><td class="nclasses">{{ s.desc.classes|length }}</td></tr>
<tr><th>on disk</th><td class="disk">{{ s.disk }}</td></tr>
<tr><th>pack</th><td class="summary">{{ s.summary }}</td></tr></table>
<h3>fields</h3><table class="fields"><tr><th>field</th><th>type</th><th>statistics</th></tr>
{% for f in s.fields %}<tr><td>{{ f.name }}</td><td>{{ f.type }}</td><td>{{ f.stats }}</td></tr>{% endfor %}</table>
{% if s.hist %}<h3>classes{% if s.more %} (the {{ s.shown }} largest of {{ s.desc.classes|length }}){% endif %}</h3>
<div class="hist">{{ s.hist|safe }}</div>
<table class="classlist"><tr><th>label</th><th>class</th><th>samples</th></tr>
{% for c in s.classes %}<tr><td>{{ c.label }}</td><td class="cname">{% if links %}<a
href="/grid?split={{ s.name|urlencode }}&cls={{ c.label }}{{ amp }}">{{ c.name }}</a>{% else %}{{ c.name }}{% endif %}</td>
<td class="ccount">{{ c.samples }}</td></tr>{% endfor %}</table>{% endif %}
</section>{% endfor %}
{{ grid|safe }}
{% endblock %}""",
    "grid.html": """{% extends layout %}{% block body %}
<h2 class="gridtitle">grid: {{ split.name }}{% if cls is not none %}, class {{ split.class_name(cls) }}{% endif %}{%
if seed is not none %}, shuffled (seed {{ seed }}){% endif %}: {{ start }}–{{ stop }} of {{ total }}</h2>
{% if pager %}<form method="get" action="/grid">{% if token %}<input type="hidden" name="token" value="{{ token }}">{% endif %}
split <select name="split">{% for n in splits %}<option{% if n == split.name %} selected{% endif %}>{{ n }}</option>{% endfor %}</select>
class {% if classes %}<select name="cls"><option value="">all</option>{% for c in classes %}<option value="{{ loop.index0 }}"{%
if loop.index0 == cls %} selected{% endif %}>{{ c }}</option>{% endfor %}</select>{% else %}<input name="cls" size="6"
value="{{ '' if cls is none else cls }}" placeholder="label">{% endif %}
seed <input name="seed" size="6" value="{{ '' if seed is none else seed }}" placeholder="index order">
per page <input name="per" size="4" value="{{ per }}"> <button type="submit">show</button></form>
<p>{% if prev is not none %}<a id="prev" href="{{ link(prev) }}">previous</a> {% endif %}{%
if next is not none %}<a id="next" href="{{ link(next) }}">next</a>{% endif %}</p>{% endif %}
<div class="grid">{% for c in cells %}<div class="cell" data-index="{{ c.index }}">
{% if c.error %}<div class="err">{{ c.error }}</div>{% else %}{% if pager %}<a class="open"
href="/sample/{{ split.name|urlencode }}/{{ c.index }}{{ q }}">{% endif %}<img class="thumb" alt="sample {{ c.index }}"
src="{{ c.src }}">{% if pager %}</a>{% endif %}{% endif %}
<div class="caption">#{{ c.index }} {{ c.caption }}</div></div>{% endfor %}</div>
{% endblock %}""",
    "bare.html": "{% block body %}{% endblock %}",
    "sample.html": """{% extends "base.html" %}{% block body %}
<h2>sample <span id="key">{{ s.key }}</span>{% if s.class %}: <span id="class">{{ s.class }}</span>{% endif %}</h2>
{% if s.error %}<p class="err" id="error">{{ s.error }}</p>{% else %}
<p id="caption">{{ s.caption }}</p>
<div class="stage" id="stage"><img id="image" alt="{{ s.key }}" src="/image/{{ s.split|urlencode }}/{{ s.index }}{{ q }}"
width="{{ s.width }}" height="{{ s.height }}">{% for b in s.boxes %}<div class="box" data-name="{{ b.name }}"
style="left:{{ b.x }}px;top:{{ b.y }}px;width:{{ b.w }}px;height:{{ b.h }}px"><span>{{ b.name }}</span></div>{% endfor %}
</div>
{% for f in s.second_images %}<div><h3>{{ f }}</h3><img class="second" alt="{{ f }}"
src="/image/{{ s.split|urlencode }}/{{ s.index }}?field={{ f|urlencode }}{{ amp }}"></div>{% endfor %}{% endif %}
<table id="fields"><tr><th>key</th><td>{{ s.key }}</td></tr>
<tr><th>source</th><td id="source">{{ s.source if s.source is not none else "(no names.jsonl)" }}</td></tr>
<tr><th>crc32</th><td id="crc">{{ s.crc32 }}</td></tr><tr><th>stored bytes</th><td>{{ s.size }}</td></tr>
<tr><th>where</th><td id="where">{{ s.where }}</td></tr>
{% if s.label is defined %}<tr><th>label</th><td>{{ s.label }} ({{ s.class }})</td></tr>{% endif %}
{% for f in s.fields %}<tr class="field" data-field="{{ f.name }}"><th>{{ f.name }}<br><small>{{ f.type }}{%
if f.shape %} {{ f.shape }} {{ f.dtype }}{% endif %}</small></th><td><pre>{{ f.text }}</pre></td></tr>{% endfor %}
</table><p><a id="json" href="/sample/{{ s.split|urlencode }}/{{ s.index }}.json{{ q }}">as json</a></p>
{% endblock %}""",
    "rejects.html": """{% extends "base.html" %}{% block body %}<h2>rejects</h2>
{% for split, groups in rejects %}<h3>{{ split }}</h3>{% if not groups %}<p class="none">nothing was rejected (or
no rejects.jsonl here)</p>{% endif %}
{% for reason, rows in groups.items() %}<details open class="reason"><summary>{{ reason }}
(<span class="count">{{ rows|length }}</span>)</summary><div class="grid">
{% for r in rows %}<div class="cell">{% if r.src %}<img class="thumb" alt="{{ r.path }}" src="{{ r.src }}">{% endif %}
<div class="caption">{{ r.path }}: {{ r.reason }}</div></div>{% endfor %}</div></details>{% endfor %}{% endfor %}
{% endblock %}""",
}

#: one environment for every page; everything it renders is escaped unless marked safe
ENV = Environment(loader=DictLoader(_TEMPLATES), autoescape=select_autoescape(default=True, default_for_string=True))

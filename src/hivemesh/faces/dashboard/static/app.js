// hivemesh dashboard: the page's one script (no framework, no build step).
//
// It opens the server-sent event stream /api/events: a `snapshot` with every
// section first, then an `update` per changed section. Each section has a
// render function that rebuilds its part of the page from the section's JSON,
// with DOM nodes (never innerHTML with data). Charts are SVG drawn here.
'use strict';

const SVG = 'http://www.w3.org/2000/svg';
const COLORS = ['#58a6ff', '#bc8cff', '#3fb950', '#d29922', '#f85149', '#39c5cf'];
const sections = {};
const versions = {};

// -- small DOM helpers ---------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === 'class') node.className = v;
    else if (k === 'text') node.textContent = v;
    else if (k.startsWith('data-') || k === 'title' || k === 'type' || k === 'placeholder') node.setAttribute(k, v);
    else node[k] = v;
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'text') node.textContent = v;
    else node.setAttribute(k, String(v));
  }
  for (const c of children.flat()) if (c) node.append(c);
  return node;
}

function badge(text, cls) {
  return el('span', { class: `badge ${cls || text}`, text });
}

function short(addr, n) {
  return typeof addr === 'string' ? addr.slice(0, n || 12) : '';
}

function fmt(x, digits) {
  if (x === null || x === undefined || Number.isNaN(x)) return '–';
  if (typeof x !== 'number') return String(x);
  if (Math.abs(x) >= 1e6) return (x / 1e6).toFixed(1) + 'M';
  if (Math.abs(x) >= 1e4) return (x / 1e3).toFixed(1) + 'k';
  return Number.isInteger(x) ? String(x) : x.toFixed(digits === undefined ? 1 : digits);
}

function replace(id, ...children) {
  const target = document.getElementById(id);
  target.replaceChildren(...children.flat().filter(Boolean));
  return target;
}

function failed(data) {
  return data && typeof data === 'object' && !Array.isArray(data) && typeof data.error === 'string';
}

function errorLine(data) {
  return el('p', { class: 'error', text: `${data.error}: ${data.message || ''}` });
}

// -- sections ------------------------------------------------------------------

function renderNode(d) {
  if (failed(d)) { replace('node', el('span', { class: 'error', text: d.message })); return; }
  const names = (d.names || []).join(', ');
  replace('node',
    el('b', { text: names || short(d.address, 16) }), ' ',
    el('span', { class: 'mono', text: short(d.address, 16) }),
    ` · ${d.listen || ''} · up ${fmt(d.uptime_s, 0)} s · ${fmt(d.events)} events in ${fmt(d.feeds)} feeds`,
    ` · ${d.members_up}/${d.members} members up · trust ${d.trust_mode || '?'}`);
}

function renderPeers(d) {
  if (failed(d)) { replace('peers', errorLine(d)); return; }
  document.getElementById('peers-count').textContent = `${d.length}`;
  if (!d.length) { replace('peers', el('p', { class: 'muted', text: 'no peers known yet' })); return; }
  const rows = d.map((p) => el('tr', { 'data-testid': 'peer-row', 'data-state': p.state },
    el('td', {}, el('b', { text: (p.names || []).join(', ') || '–' })),
    el('td', { class: 'mono', text: short(p.address, 16), title: p.address }),
    el('td', {}, badge(p.state)),
    el('td', { text: p.link.direction ? `${p.link.type} · ${p.link.direction}` : p.link.type }),
    el('td', { class: 'mono', text: p.link.endpoint || (p.endpoints || [])[0] || '–' }),
    el('td', { 'data-testid': 'peer-rtt', text: p.rtt_ms === null || p.rtt_ms === undefined ? '–' : `${fmt(p.rtt_ms, 2)} ms` }),
    el('td', { text: p.link.bytes_in === undefined ? '–' : `${fmt(p.link.bytes_in)} / ${fmt(p.link.bytes_out)} B` })));
  replace('peers', el('table', {},
    el('thead', {}, el('tr', {}, ['name', 'address', 'health', 'link', 'endpoint', 'round trip', 'in / out']
      .map((h) => el('th', { text: h })))),
    el('tbody', {}, rows)));
}

function leafCounts(node, acc) {
  if (node.kind === 'leaf') {
    acc.leaves += 1;
    if (node.status === 'done') acc.done += 1;
    if (node.status === 'claimed') acc.claimed += 1;
  }
  for (const c of node.children || []) leafCounts(c, acc);
  return acc;
}

// an agent's name if the peers list knows one, else the start of its address
function agentName(item) {
  const addr = item.address || '';
  const peer = (Array.isArray(sections.peers) ? sections.peers : []).find((p) => p.address === addr);
  if (peer && peer.names && peer.names.length) return peer.names[0];
  return addr ? short(addr, 10) : short(item.author, 8);
}

function planNode(n) {
  const votes = (n.proposals || []).reduce((s, p) => s + (p.votes || 0), 0);
  const live = (n.claims || []).filter((c) => !c.released);
  const meta = [];
  if (n.kind !== 'leaf' && (n.proposals || []).length) {
    meta.push(`${n.proposals.length} proposal${n.proposals.length > 1 ? 's' : ''}, ${votes} vote${votes === 1 ? '' : 's'}${n.accepted ? ', accepted' : ''}`);
  }
  if (live.length) meta.push(`claimed by ${live.map(agentName).join(', ')}`);
  if (n.attempts > 1) meta.push(`attempt ${n.attempts}`);
  const line = el('div', { class: 'node-line' },
    badge(n.status), el('span', { class: 'meta', text: n.kind }),
    el('span', { class: 'title', text: n.title }),
    meta.length ? el('span', { class: 'meta', text: meta.join(' · ') }) : null,
    n.result ? el('span', { class: 'meta', text: `→ ${String(n.result.text).slice(0, 80)} (${agentName(n.result)})` }) : null);
  const kids = (n.children || []).length ? el('ul', { class: 'tree' }, n.children.map(planNode)) : null;
  return el('li', {
    'data-testid': 'plan-node', 'data-kind': n.kind, 'data-status': n.status,
    'data-proposals': String((n.proposals || []).length), 'data-votes': String(votes),
  }, line, kids);
}

function renderPlan(d) {
  if (failed(d)) { replace('plan', errorLine(d)); return; }
  document.getElementById('plan-count').textContent = d.goals ? `${d.goals} goal${d.goals > 1 ? 's' : ''}` : '';
  if (!d.shown || !d.shown.length) { replace('plan', el('p', { class: 'muted', text: 'no goals yet' })); return; }
  replace('plan', d.shown.map((g) => {
    if (failed(g) || !g.tree) return el('div', { class: 'goal' }, errorLine(g.error ? g : { error: 'missing', message: g.id }));
    const c = leafCounts(g.tree, { leaves: 0, done: 0, claimed: 0 });
    return el('div', { class: 'goal', 'data-testid': 'plan-goal', 'data-status': g.tree.status },
      el('div', { class: 'meta muted', text: `goal ${short(g.id, 10)} · ${c.done}/${c.leaves} leaves done · ${c.claimed} claimed` }),
      el('ul', { class: 'tree root' }, planNode(g.tree)),
      g.answer ? el('p', { class: 'answer', 'data-testid': 'plan-answer', text: g.answer }) : null);
  }));
}

// escalations keep their DOM (a half-typed answer survives updates)
const questionNodes = new Map();

function questionNode(q) {
  const input = el('input', { type: 'text', placeholder: 'your answer', 'data-testid': 'answer-input' });
  const button = el('button', { type: 'submit', 'data-testid': 'answer-button', text: 'Answer' });
  const status = el('span', { class: 'muted' });
  const form = el('form', {}, input, button);
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const text = input.value.trim();
    if (!text) return;
    button.disabled = true;
    status.textContent = ' sending…';
    fetch('/api/audit/answer', {
      method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ id: q.id, text }),
    }).then((r) => r.json().then((body) => ({ ok: r.ok, body })))
      .then(({ ok, body }) => {
        status.textContent = ok ? ' sent' : ` ${body.error ? body.error.message : 'failed'}`;
        if (!ok) button.disabled = false;
      })
      .catch(() => { status.textContent = ' failed to send'; button.disabled = false; });
  });
  const head = el('div', { class: 'node-line' });
  const answer = el('div', { class: 'answer', 'data-testid': 'escalation-answer' });
  const node = el('div', { class: 'question', 'data-testid': 'escalation', 'data-id': q.id },
    head, el('div', { class: 'wrap', text: q.question || '' }), form, status, answer);
  node._parts = { head, form, answer, status };
  return node;
}

function renderEscalations(questions) {
  const box = document.getElementById('escalations');
  if (!questions.length) { questionNodes.clear(); replace('escalations', el('p', { class: 'muted', text: 'none' })); return; }
  const seen = new Set();
  const ordered = [...questions].sort((a, b) => (a.answer === null) === (b.answer === null) ? 0 : (a.answer === null ? -1 : 1));
  const nodes = ordered.map((q) => {
    seen.add(q.id);
    let node = questionNodes.get(q.id);
    if (!node) { node = questionNode(q); questionNodes.set(q.id, node); }
    const open = q.answer === null || q.answer === undefined;
    node.className = `question ${open ? 'open' : 'answered'}`;
    node.setAttribute('data-state', open ? 'open' : 'answered');
    node._parts.head.replaceChildren(badge(open ? 'open' : 'answered'),
      el('b', { text: q.shop || '' }), el('span', { class: 'meta', text: `${q.reason || ''} · asked by ${short(q.asked_by, 10)}` }));
    node._parts.form.hidden = !open;
    node._parts.answer.hidden = open;
    node._parts.answer.textContent = open ? '' : `answer: ${q.answer}`;
    if (!open) node._parts.status.textContent = '';
    return node;
  });
  for (const id of [...questionNodes.keys()]) if (!seen.has(id)) questionNodes.delete(id);
  box.replaceChildren(...nodes);
}

function renderAudit(d) {
  if (failed(d)) { replace('audit', errorLine(d)); return; }
  const st = d.status || {};
  renderEscalations(d.questions || []);
  if (!st.audit) { replace('audit', el('p', { class: 'muted', text: 'no audit yet' })); return; }
  const batches = Object.entries(st.batches || {}).map(([n, [done, total]]) =>
    el('div', { class: 'batch', 'data-testid': 'audit-batch' },
      el('span', { text: `batch ${n}` }),
      el('div', { class: 'bar' }, el('span', { style: `width:${total ? (100 * done) / total : 0}%` })),
      el('span', { text: `${done}/${total}` })));
  replace('audit',
    el('p', { 'data-testid': 'audit-progress' },
      st.finished ? badge('done') : badge('executing'),
      ` ${st.done}/${st.shops} shops · ${st.calls} tool calls · ${st.open_questions} open question${st.open_questions === 1 ? '' : 's'} · ${st.takeovers} takeover${st.takeovers === 1 ? '' : 's'}`),
    batches);
}

function renderContext(d) {
  if (failed(d)) { replace('context', errorLine(d)); return; }
  document.getElementById('context-count').textContent = d.total ? `${d.total} context${d.total > 1 ? 's' : ''}` : '';
  if (!d.contexts || !d.contexts.length) { replace('context', el('p', { class: 'muted', text: 'no keys yet' })); return; }
  replace('context', d.contexts.map((c) => el('div', {},
    el('h3', { text: `${c.context} (${c.keys} key${c.keys === 1 ? '' : 's'})` }),
    el('table', {}, el('tbody', {}, c.items.map((it) => el('tr', { 'data-testid': 'context-key' },
      el('td', { class: 'mono', text: it.key }), el('td', { class: 'muted', text: it.type }),
      el('td', { class: 'wrap mono', text: it.value }))))))));
}

function renderAlerts(d) {
  if (failed(d)) { replace('alerts', el('p', { class: 'muted', text: 'alerts come from the collector: ' + d.message })); return; }
  document.getElementById('alerts-count').textContent = d.firing ? `${d.firing} firing` : '';
  if (!d.alerts.length) { replace('alerts', el('p', { class: 'muted', text: 'no alerts' })); return; }
  replace('alerts', el('table', {}, el('tbody', {}, d.alerts.map((a) => el('tr', { 'data-testid': 'alert' },
    el('td', {}, badge(a.status)), el('td', { text: a.rule || '' }),
    el('td', { class: 'wrap', text: a.summary || a.message || a.key || '' }))))));
}

// -- charts (SVG) --------------------------------------------------------------

function legend(names) {
  return el('div', { class: 'legend' }, names.map((n, i) => el('span', {}, el('i', { style: `background:${COLORS[i % COLORS.length]}` }), n)));
}

function noData(id, text) {
  replace(id, el('p', { class: 'muted', text: text || 'no data yet' }));
}

// horizontal bars: rows [{label, values: [..]}], stacked by series
function barChart(id, rows, series, unit) {
  if (!rows.length) { noData(id); return; }
  const W = 420, row = 18, left = 110, H = rows.length * row + 18;
  const max = Math.max(1e-9, ...rows.map((r) => r.values.reduce((s, v) => s + (v || 0), 0)));
  const g = svg('svg', { viewBox: `0 0 ${W} ${H}`, role: 'img' });
  rows.forEach((r, i) => {
    const y = i * row + 2;
    g.append(svg('text', { x: left - 6, y: y + 11, 'text-anchor': 'end', text: String(r.label).slice(0, 18) }));
    let x = left;
    r.values.forEach((v, k) => {
      const w = ((v || 0) / max) * (W - left - 60);
      g.append(svg('rect', { x, y, width: Math.max(0, w), height: row - 5, fill: COLORS[k % COLORS.length], 'data-value': v || 0 }));
      x += w;
    });
    const total = r.values.reduce((s, v) => s + (v || 0), 0);
    g.append(svg('text', { x: x + 4, y: y + 11, text: unit === '%' ? `${(total * 100).toFixed(1)}%` : fmt(total) }));
  });
  g.append(svg('line', { class: 'axis', x1: left, y1: 0, x2: left, y2: H - 14 }));
  replace(id, g, series.length > 1 ? legend(series) : null);
}

// lines over time: points [{t, k1, k2...}]
function lineChart(id, points, keys) {
  if (!points.length) { noData(id); return; }
  const W = 420, H = 160, L = 40, B = 20, T = 6, R = 8;
  const ts = points.map((p) => p.t);
  const t0 = Math.min(...ts), t1 = Math.max(...ts, t0 + 1);
  const vmax = Math.max(1e-9, ...points.flatMap((p) => keys.map((k) => p[k] || 0)));
  const X = (t) => L + ((t - t0) / (t1 - t0)) * (W - L - R);
  const Y = (v) => H - B - (v / vmax) * (H - B - T);
  const g = svg('svg', { viewBox: `0 0 ${W} ${H}`, role: 'img' });
  for (let i = 0; i <= 4; i += 1) {
    const v = (vmax * i) / 4;
    g.append(svg('line', { class: 'axis', x1: L, x2: W - R, y1: Y(v), y2: Y(v), 'stroke-dasharray': i ? '2 3' : '' }));
    g.append(svg('text', { x: L - 4, y: Y(v) + 3, 'text-anchor': 'end', text: fmt(v, 0) }));
  }
  const clock = (t) => new Date(t).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit' });
  g.append(svg('text', { x: L, y: H - 4, text: clock(t0) }));
  g.append(svg('text', { x: W - R, y: H - 4, 'text-anchor': 'end', text: clock(t1) }));
  keys.forEach((k, i) => {
    const pts = points.map((p) => `${X(p.t).toFixed(1)},${Y(p[k] || 0).toFixed(1)}`);
    const color = COLORS[i % COLORS.length];
    g.append(svg('polyline', { points: pts.join(' '), fill: 'none', stroke: color, 'stroke-width': 1.6, 'data-key': k }));
    if (points.length === 1) g.append(svg('circle', { cx: X(points[0].t), cy: Y(points[0][k] || 0), r: 3, fill: color }));
  });
  replace(id, g, legend(keys));
}

function renderTelemetry(d) {
  const note = document.getElementById('telemetry-note');
  const ids = ['chart-tokens', 'chart-cost', 'chart-tools', 'chart-latency', 'chart-toolrate'];
  if (failed(d)) {
    note.textContent = `no telemetry on this node (${d.message}). Serve the dashboard from the node that runs the collector (hivemesh up --collector).`;
    ids.forEach((id) => noData(id, '–'));
    return;
  }
  note.textContent = '';
  const agents = d.agents || [];
  barChart('chart-tokens', agents.filter((a) => a.tokens).map((a) => ({ label: a.agent, values: [a.input_tokens, a.output_tokens] })), ['input', 'output']);
  const [wi, wo] = d.cost_weights || [1, 4];
  document.getElementById('cost-note').textContent = `(${wi} × input + ${wo} × output tokens)`;
  barChart('chart-cost', agents.filter((a) => a.cost).map((a) => ({ label: a.agent, values: [a.cost] })), ['cost']);
  barChart('chart-tools', (d.tools || []).map((t) => ({ label: t.tool, values: [t.failure_rate || 0] })), ['failure rate'], '%');
  lineChart('chart-latency', d.latency || [], ['p50', 'p90', 'p99']);
  lineChart('chart-toolrate', (d.latency || []).filter((p) => p.tool_calls), ['tool_calls', 'tool_failures']);
  replace('agents-table', agents.length ? el('table', {},
    el('thead', {}, el('tr', {}, ['agent', 'records', 'failures', 'tokens', 'cost', 'p50 ms', 'p99 ms'].map((h) => el('th', { text: h })))),
    el('tbody', {}, agents.map((a) => el('tr', { 'data-testid': 'agent-row' },
      el('td', { text: a.agent }), el('td', { text: fmt(a.records) }), el('td', { text: fmt(a.failures) }),
      el('td', { text: fmt(a.tokens) }), el('td', { text: fmt(a.cost) }),
      el('td', { text: fmt(a.p50_ms) }), el('td', { text: fmt(a.p99_ms) }))))) : null);
}

function renderEvents(d) {
  document.getElementById('events-count').textContent = `${fmt(d.seen)} seen`;
  replace('events', (d.recent || []).map((e) => el('li', { 'data-testid': 'event' },
    el('span', { class: 'mono', text: e.kind }), el('span', { class: 'muted', text: ` · ${e.author} #${e.seq}` }))));
}

const RENDER = {
  node: renderNode, peers: renderPeers, plan: renderPlan, audit: renderAudit, context: renderContext,
  alerts: renderAlerts, telemetry: renderTelemetry, events: renderEvents,
};

function apply(name, data, version) {
  if (version !== undefined && versions[name] !== undefined && version <= versions[name]) return;
  sections[name] = data;
  if (version !== undefined) versions[name] = version;
  const render = RENDER[name];
  if (render) render(data);
  document.body.setAttribute(`data-${name}-version`, String(versions[name] || 0));
}

// -- the stream ----------------------------------------------------------------

function setLive(on) {
  const live = document.getElementById('live');
  live.className = `live ${on ? 'on' : 'off'}`;
  live.textContent = on ? 'live' : 'reconnecting…';
}

function connect() {
  const stream = new EventSource('/api/events');
  stream.addEventListener('open', () => setLive(true));
  stream.addEventListener('error', () => setLive(false));
  stream.addEventListener('snapshot', (ev) => {
    const snap = JSON.parse(ev.data);
    for (const name of Object.keys(versions)) delete versions[name];
    for (const [name, data] of Object.entries(snap.sections)) apply(name, data, snap.versions[name]);
    setLive(true);
  });
  stream.addEventListener('update', (ev) => {
    const u = JSON.parse(ev.data);
    apply(u.section, u.data, u.version);
  });
  stream.addEventListener('dropped', () => setLive(false));
}

connect();

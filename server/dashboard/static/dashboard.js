// Tandem dashboard: polls the coordinator's JSON endpoints and draws
// tables, SVG line charts and the per-worker phase timeline. No libraries.
'use strict';

const POLL_MS = 2000;
const MAX_EVENT_PAGES = 20;  // per poll: 20 x 256 events
const MAX_DRAWN_POINTS = 1000;  // per chart; longer series are thinned
const MAX_EVENTS_KEPT = 2000;   // newest non-step events
const SVG = 'http://www.w3.org/2000/svg';
const PHASE_COLORS = {
  setup: '#9aa0a6', sft_step: '#7b61ff', rollout: '#1a73e8', score: '#f9ab00', logprobs: '#12b5cb',
  update: '#1e8e3e', eval: '#a142f4', checkpoint: '#e8710a', flush_checkpoints: '#c26401',
  sync_weights: '#5f6368', export: '#795548', teardown: '#bdc1c6', recovery: '#d93025',
};

const state = {
  jobId: null,         // the job shown below the tables
  names: {},           // worker id -> name (from the cluster list)
  steps: new Map(),    // its step metrics by step (the newest value: a recovery redoes steps)
  events: [],          // its other events (recoveries, states, checkpoints), newest last
  after: 0,            // last event seq fetched
  job: null,
  now: 0,
};

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function svgEl(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

async function getJson(path) {
  const r = await fetch(path, {credentials: 'same-origin', cache: 'no-store'});
  if (r.status === 401) {
    window.location.href = '/dashboard/login';
    throw new Error('not logged in');
  }
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || ('HTTP ' + r.status));
  return body;
}

function fmtBytes(n) {
  if (n === null || n === undefined) return '–';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return n.toFixed(i ? 1 : 0) + ' ' + units[i];
}

function fmtNum(v) {
  if (v === null || v === undefined) return '–';
  if (v === 0) return '0';
  const a = Math.abs(v);
  if (a >= 1000) return Math.round(v).toLocaleString('en');
  if (a >= 1) return v.toFixed(3).replace(/\.?0+$/, '');
  return v.toPrecision(3);
}

function fmtTime(t) {
  return t ? new Date(t * 1000).toLocaleTimeString('en-GB') : '–';
}

function stateBadge(s) { return el('span', {class: 'state ' + s}, s); }

function fillRows(tbody, rows) {
  tbody.replaceChildren(...rows);
}

function renderCluster(c) {
  state.now = c.time;
  for (const w of c.workers) state.names[w.id] = w.name;
  const rows = c.workers.map((w) => {
    const tr = el('tr', {'data-worker': w.id});
    tr.append(el('td', {}, w.name), el('td', {}, w.host),
              el('td', {}, w.device + (w.device_count > 1 ? ' ×' + w.device_count : '')),
              el('td', {}, fmtBytes(w.memory_in_use_bytes) + ' / ' + fmtBytes(w.memory_bytes)));
    const st = el('td');
    st.append(stateBadge(w.state + (w.preempting ? ' (leaving)' : '')));
    tr.append(st, el('td', {}, w.job_id ? w.job_id + ' / ' + w.rank : '–'),
              el('td', {}, w.last_heartbeat ? Math.max(0, c.time - w.last_heartbeat).toFixed(1) + ' s ago' : '–'));
    return tr;
  });
  fillRows(document.querySelector('#workers tbody'), rows);
  const counts = Object.entries(c.jobs_by_state).map(([k, v]) => v + ' ' + k).join(', ');
  document.getElementById('cluster-summary').textContent =
      c.workers.length + ' worker' + (c.workers.length === 1 ? '' : 's') + (counts ? '; jobs: ' + counts : '');
}

function selectJob(id) {
  if (state.jobId === id) return;
  state.jobId = id;
  state.steps = new Map();
  state.events = [];
  state.after = 0;
  state.job = null;
  history.replaceState(null, '', '#job=' + encodeURIComponent(id));
  poll();
}

function renderJobs(list) {
  const rows = list.jobs.map((j) => {
    const tr = el('tr', {class: 'selectable' + (j.id === state.jobId ? ' selected' : ''), 'data-job': j.id});
    tr.append(el('td', {}, j.id), el('td', {}, j.name), el('td', {}, j.kind));
    const st = el('td');
    st.append(stateBadge(j.state));
    tr.append(st, el('td', {}, j.step + ' / ' + j.total_steps), el('td', {}, String(j.workers)),
              el('td', {}, fmtNum(j.loss)), el('td', {}, fmtNum(j.reward)), el('td', {}, fmtNum(j.accuracy)),
              el('td', {}, fmtNum(j.tokens_per_s)));
    tr.addEventListener('click', () => selectJob(j.id));
    return tr;
  });
  fillRows(document.querySelector('#jobs tbody'), rows);
  if (!state.jobId && list.jobs.length) {
    const running = list.jobs.find((j) => j.state === 'running' || j.state === 'recovering');
    selectJob((running || list.jobs[0]).id);
  }
}

// A step's name on an x axis: warm-start steps are numbered -1, -2, ...
function stepLabel(step) {
  return step < 0 ? 'warm-up ' + (-step) : step === 0 ? 'baseline' : 'step ' + step;
}

// Training order: the warm start (-1, -2, ...), the baseline (0), then RL steps.
function stepOrder(step) { return step < 0 ? -1e12 - step : step; }

// A line chart into an <svg>: points are [x, y, label] with x in training
// order; data-points says how many (more than MAX_DRAWN_POINTS are thinned
// for drawing).
function drawChart(svg, points) {
  const w = svg.clientWidth || 400, h = svg.clientHeight || 150;
  const m = {l: 48, r: 10, t: 8, b: 22};
  svg.setAttribute('viewBox', `0 0 ${w} ${h}`);
  svg.setAttribute('data-points', String(points.length));
  svg.replaceChildren();
  if (points.length > MAX_DRAWN_POINTS) {
    const every = Math.ceil(points.length / MAX_DRAWN_POINTS);
    points = points.filter((p, i) => i % every === 0 || i === points.length - 1);
  }
  if (!points.length) {
    svg.append(svgEl('text', {x: w / 2, y: h / 2, 'text-anchor': 'middle'}, 'no data yet'));
    return;
  }
  let [x0, x1] = [Math.min(...points.map((p) => p[0])), Math.max(...points.map((p) => p[0]))];
  let [y0, y1] = [Math.min(...points.map((p) => p[1])), Math.max(...points.map((p) => p[1]))];
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) { y0 -= Math.abs(y0) * 0.1 || 1; y1 += Math.abs(y1) * 0.1 || 1; }
  const sx = (x) => m.l + (x - x0) / (x1 - x0) * (w - m.l - m.r);
  const sy = (y) => h - m.b - (y - y0) / (y1 - y0) * (h - m.t - m.b);
  for (let i = 0; i <= 4; i++) {
    const y = y0 + (y1 - y0) * i / 4;
    svg.append(svgEl('line', {class: 'grid', x1: m.l, x2: w - m.r, y1: sy(y), y2: sy(y)}));
    svg.append(svgEl('text', {x: m.l - 4, y: sy(y) + 3, 'text-anchor': 'end'}, fmtNum(y)));
  }
  svg.append(svgEl('text', {x: m.l, y: h - 6}, points[0][2]));
  svg.append(svgEl('text', {x: w - m.r, y: h - 6, 'text-anchor': 'end'}, points[points.length - 1][2]));
  svg.append(svgEl('polyline', {points: points.map((p) => sx(p[0]).toFixed(1) + ',' + sy(p[1]).toFixed(1)).join(' ')}));
  const last = points[points.length - 1];
  const dot = svgEl('circle', {cx: sx(last[0]), cy: sy(last[1]), r: 3});
  dot.append(svgEl('title', {}, `${last[2]}: ${fmtNum(last[1])}`));
  svg.append(dot);
}

function renderCharts() {
  const ms = [...state.steps.values()].sort((a, b) => stepOrder(a.step) - stepOrder(b.step));
  const order = new Map(ms.map((m, i) => [m.step, i]));
  const series = (keep, value) => ms.filter(keep).map((m) => [order.get(m.step), value(m), stepLabel(m.step)]);
  drawChart(document.getElementById('chart-loss'), series((m) => m.loss !== null && m.loss !== 0, (m) => m.loss));
  drawChart(document.getElementById('chart-reward'), series((m) => m.rl, (m) => m.reward));
  drawChart(document.getElementById('chart-accuracy'), series((m) => m.evaluated || m.accuracy, (m) => m.accuracy));
  drawChart(document.getElementById('chart-tokens'), series((m) => m.tokens_per_s > 0, (m) => m.tokens_per_s));
}

// Recovery periods: [start, end] from the "recovered in" events (their
// metrics say how long) and the one in progress, if any.
function recoveryPeriods(job, now) {
  const out = [];
  for (const e of state.events) {
    const secs = e.kind === 'recovery' && e.metrics && e.metrics.extra && e.metrics.extra.recovery_seconds;
    if (secs) out.push([e.time - secs, e.time]);
  }
  if (job.recovery.in_progress_since) out.push([job.recovery.in_progress_since, now]);
  return out;
}

function renderTimeline(job, now) {
  const svg = document.getElementById('timeline');
  const choice = document.getElementById('window').value;
  // "fit": from the oldest span fetched (at most 10 min ago) to now.
  let windowS = Number(choice);
  if (choice === 'fit') {
    const first = Math.min(now, ...job.spans.map((s) => s.start));
    windowS = Math.max(10, (now - first) * 1.02);
  }
  const rows = job.members.slice();
  // Workers that ran spans but are no longer members (replaced) get rows too.
  for (const s of job.spans) {
    if (!rows.some((r) => r.id === s.worker)) rows.push({id: s.worker, name: state.names[s.worker] || s.worker, rank: null});
  }
  const w = svg.clientWidth || 900, rowH = 26, m = {l: 120, r: 10, t: 6, b: 20};
  const h = m.t + m.b + Math.max(1, rows.length) * rowH;
  svg.setAttribute('viewBox', `0 0 ${w} ${h}`);
  svg.setAttribute('height', String(h));
  svg.replaceChildren();
  const t0 = now - windowS;
  const sx = (t) => m.l + Math.max(0, Math.min(1, (t - t0) / windowS)) * (w - m.l - m.r);
  for (let i = 0; i <= 6; i++) {
    const t = t0 + windowS * i / 6;
    svg.append(svgEl('line', {class: 'grid', x1: sx(t), x2: sx(t), y1: m.t, y2: h - m.b}));
    svg.append(svgEl('text', {x: sx(t), y: h - 6, 'text-anchor': i === 0 ? 'start' : i === 6 ? 'end' : 'middle'},
                     i === 6 ? 'now' : '-' + Math.round(windowS - windowS * i / 6) + ' s'));
  }
  rows.forEach((r, i) => {
    const y = m.t + i * rowH;
    const label = svgEl('text', {x: 4, y: y + rowH / 2 + 3}, (r.rank === null ? '(left) ' : 'rank ' + r.rank + ' ') + r.name);
    svg.append(label);
    const g = svgEl('g', {class: 'row', 'data-worker': r.id});
    for (const s of job.spans) {
      if (s.worker !== r.id) continue;
      const end = s.end === null ? now : s.end;
      if (end < t0) continue;
      const x = sx(s.start), x2 = sx(end);
      const cls = 'span phase-' + s.phase + (s.end === null ? ' running' : '') + (s.ok ? '' : ' failed');
      const rect = svgEl('rect', {class: cls, x: x, y: y + 3, width: Math.max(1, x2 - x), height: rowH - 6,
                                  fill: PHASE_COLORS[s.phase] || '#444', 'data-phase': s.phase});
      rect.append(svgEl('title', {}, `${s.phase} step ${s.step} (generation ${s.generation}): ` +
                                     `${(end - s.start).toFixed(3)} s${s.ok ? '' : ', failed or abandoned'}` +
                                     (s.peak_memory_bytes ? `, peak ${fmtBytes(s.peak_memory_bytes)}` : '')));
      g.append(rect);
    }
    svg.append(g);
  });
  for (const [a, b] of recoveryPeriods(job, now)) {
    if (b < t0) continue;
    const band = svgEl('rect', {class: 'recovery', x: sx(a), y: m.t, width: Math.max(2, sx(b) - sx(a)), height: h - m.t - m.b});
    band.append(svgEl('title', {}, `recovery: ${(b - a).toFixed(2)} s`));
    svg.append(band);
  }
  const seen = new Set(job.spans.map((s) => s.phase));
  const legend = document.getElementById('legend');
  legend.replaceChildren(...Object.entries(PHASE_COLORS)
    .filter(([p]) => seen.has(p) || p === 'recovery')
    .map(([p, c]) => {
      const item = el('span', {}, '');
      const sw = el('span', {class: 'swatch'});
      sw.style.background = c;
      item.append(sw, document.createTextNode(p));
      return item;
    }));
}

function renderJob(j, now) {
  const section = document.getElementById('job');
  section.hidden = false;
  document.getElementById('job-title').textContent = j.name + ' (' + j.id + ')';
  const st = document.getElementById('job-state');
  st.textContent = j.state;
  st.className = 'state ' + j.state;
  document.getElementById('job-info').textContent =
      `${j.kind}, step ${j.step} of ${j.total_steps}, ${j.workers} worker${j.workers === 1 ? '' : 's'}, generation ${j.generation}, ` +
      `${j.recovery.recoveries} recover${j.recovery.recoveries === 1 ? 'y' : 'ies'}` + (j.reason ? '; ' + j.reason : '');
  renderCharts();
  renderTimeline(j, now);
  const rec = state.events.filter((e) => e.kind === 'recovery').slice(-50).reverse();
  document.getElementById('recoveries').replaceChildren(...(rec.length ? rec.map((e) => el('li', {}, fmtTime(e.time) + '  ' + e.message))
                                                                      : [el('li', {class: 'muted'}, 'none')]));
  const cps = j.checkpoints.slice().sort((a, b) => b.step - a.step);
  fillRows(document.querySelector('#checkpoints tbody'), cps.map((c) => {
    const tr = el('tr');
    tr.append(el('td', {}, String(c.step)), el('td', {}, fmtBytes(c.bytes)), el('td', {}, fmtTime(c.time)), el('td', {}, c.path));
    return tr;
  }));
}

async function pollJob() {
  const jobId = state.jobId;
  if (!jobId) return;
  const id = encodeURIComponent(jobId);
  for (let page = 0; page < MAX_EVENT_PAGES; page++) {
    const ev = await getJson(`/dashboard/api/events?id=${id}&after=${state.after}`);
    if (state.jobId !== jobId) return;  // another job was selected meanwhile
    for (const e of ev.events) {
      if (e.kind === 'step' && e.metrics) {
        // Only what the charts need: a long job has many steps.
        const m = e.metrics;
        state.steps.set(m.step, {step: m.step, loss: m.loss, reward: m.reward, accuracy: m.accuracy,
                                 tokens_per_s: m.tokens_per_s, evaluated: 'eval' in m.phase_seconds,
                                 rl: 'rollout' in m.phase_seconds || 'score' in m.phase_seconds});
      } else {
        state.events.push(e);
      }
    }
    if (state.events.length > MAX_EVENTS_KEPT) state.events.splice(0, state.events.length - MAX_EVENTS_KEPT);
    state.after = ev.next;
    if (ev.events.length < 256) break;
  }
  const choice = document.getElementById('window').value;
  const r = await getJson(`/dashboard/api/job?id=${id}&window=${choice === 'fit' ? 600 : choice}`);
  if (state.jobId !== jobId) return;
  state.job = r.job;
  renderJob(r.job, r.time);
}

let polling = false;
async function poll() {
  if (polling) return;
  polling = true;
  const status = document.getElementById('status');
  try {
    renderCluster(await getJson('/dashboard/api/cluster'));
    renderJobs(await getJson('/dashboard/api/jobs'));
    await pollJob();
    status.textContent = 'updated ' + new Date().toLocaleTimeString('en-GB');
    status.classList.remove('error');
  } catch (e) {
    status.textContent = 'error: ' + e.message;
    status.classList.add('error');
  } finally {
    polling = false;
  }
}

document.addEventListener('DOMContentLoaded', () => {
  const m = /^#job=(.+)$/.exec(window.location.hash);
  if (m) state.jobId = decodeURIComponent(m[1]);
  document.getElementById('window').addEventListener('change', poll);
  poll();
  setInterval(poll, POLL_MS);
});

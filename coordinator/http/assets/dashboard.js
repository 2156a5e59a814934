// The dashboard's one script, for both pages (body data-page="index" or "job").
//
// It polls the coordinator's JSON API about once a second and redraws. Everything it
// shows comes from the coordinator and may hold a job's (or a trainer's) text, so
// the DOM is built with createElement and textContent only: no markup is parsed from
// data, nothing is evaluated. The API's JSON is protobuf's JSON mapping of the same
// messages ddpctl gets (`ddpctl get -o json`): int64 fields arrive as strings.
'use strict';

(function () {
  const POLL_MS = 1000;
  // The whole stored step history (what fills the charts between the polls' latest
  // points) is read again every second while it is short, less often as it grows:
  // a second per 2,000 points, at most every 15 s.
  const HISTORY_POINTS_PER_S = 2000;
  const HISTORY_MAX_MS = 15000;
  const LOG_LINES = 100;
  const COLORS = ['#2563eb', '#dc2626', '#16a34a', '#9333ea', '#ea580c', '#0891b2',
                  '#ca8a04', '#db2777'];

  // --- Small helpers -------------------------------------------------------------

  function num(v) { return v === undefined || v === null || v === '' ? 0 : Number(v); }

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }

  function byId(id) { return document.getElementById(id); }

  function setText(id, text) { byId(id).textContent = text; }

  // Replaces a tbody's rows. A cell is a string, or {text, cls, href}.
  function fillTable(tbody, rows) {
    const fresh = document.createDocumentFragment();
    for (const row of rows) {
      const tr = document.createElement('tr');
      for (const c of row) {
        const cell = typeof c === 'object' && c !== null ? c : { text: c };
        const td = el('td', undefined, cell.cls);
        if (cell.title) td.title = cell.title;
        if (cell.href) {
          const a = el('a', cell.text);
          a.href = cell.href;
          td.appendChild(a);
        } else {
          td.textContent = cell.text === undefined ? '-' : String(cell.text);
        }
        tr.appendChild(td);
      }
      fresh.appendChild(tr);
    }
    tbody.replaceChildren(fresh);
  }

  function duration(ms) {
    if (!(ms >= 0)) return '-';
    const s = Math.floor(ms / 1000);
    if (s < 60) return s + 's';
    const m = Math.floor(s / 60);
    if (m < 60) return m + 'm' + String(s % 60).padStart(2, '0') + 's';
    const h = Math.floor(m / 60);
    if (h < 48) return h + 'h' + String(m % 60).padStart(2, '0') + 'm';
    return Math.floor(h / 24) + 'd' + String(h % 24).padStart(2, '0') + 'h';
  }

  function ago(ms, now) {
    if (!ms) return '-';
    const d = Math.max(0, now - ms) / 1000;
    return d < 60 ? d.toFixed(1) + 's ago' : duration(now - ms) + ' ago';
  }

  function fixed(v, digits) {
    const x = Number(v);
    return Number.isFinite(x) ? x.toFixed(digits) : '-';
  }

  function thousands(v) {
    const x = Number(v);
    return Number.isFinite(x) ? Math.round(x).toLocaleString('en-US') : '-';
  }

  function stamp(ms) {
    if (!ms) return '-';
    const d = new Date(ms);
    return d.toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z');
  }

  // --- The API -------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }

  async function api(path) {
    const r = await fetch(path, { credentials: 'same-origin', cache: 'no-store',
                                  headers: { Accept: 'application/json' } });
    let body = null;
    try { body = await r.json(); } catch (e) { body = null; }
    if (!r.ok) {
      throw new ApiError(r.status, body && body.error ? body.error : r.status + ' ' + r.statusText);
    }
    return body;
  }

  function showError(e) {
    const box = byId('error');
    if (!e) {
      box.hidden = true;
      box.textContent = '';
      return;
    }
    box.hidden = false;
    box.textContent = e instanceof ApiError ? e.message
        : 'the coordinator does not answer (' + e.message + '); retrying every second';
  }

  function setStatus(text) { setText('status', text); }

  // Runs `tick` now and every POLL_MS after the previous one finished; stops for good
  // on an authentication or permission error (a new token needs a reload anyway).
  function poll(tick) {
    async function run() {
      try {
        await tick();
        showError(null);
        setStatus('updated ' + new Date().toLocaleTimeString());
      } catch (e) {
        showError(e);
        if (e instanceof ApiError && (e.status === 401 || e.status === 403 || e.status === 404)) {
          setStatus('stopped');
          return;
        }
      }
      setTimeout(run, POLL_MS);
    }
    run();
  }

  // --- The front page: jobs and workers ----------------------------------------

  function workerState(w) {
    let s = w.alive ? 'alive' : 'lost';
    if (w.alive && num(w.quarantined_until_ms) > 0) s = 'quarantined';
    if (w.maintenance === 'WORKER_CORDONED') s += ',cordoned';
    if (w.maintenance === 'WORKER_DRAINING') {
      s += (w.jobs && w.jobs.length) ? ',draining' : ',drained';
    }
    return s;
  }

  function labels(map) {
    const keys = Object.keys(map || {}).sort();
    return keys.length ? keys.map((k) => k + '=' + map[k]).join(' ') : '-';
  }

  function gpus(w) {
    const n = num(w.gpus);
    if (!n) return '0';
    const models = [...new Set((w.gpu_devices || []).map((d) => d.model).filter(Boolean))];
    return models.length ? n + ' (' + models.join(', ') + ')' : String(n);
  }

  async function indexTick() {
    const [jobs, workers] = await Promise.all([api('/api/jobs'), api('/api/workers')]);
    const now = num(jobs.now_ms);
    fillTable(document.querySelector('#jobs tbody'), jobs.jobs.map((j) => [
      { text: j.id, href: '/jobs/' + encodeURIComponent(j.id) },
      { text: j.state, cls: 'state st-' + j.state },
      j.owner || '-',
      String(num(j.priority)),
      j.min_nodes === j.max_nodes ? String(j.min_nodes) : j.min_nodes + '-' + j.max_nodes,
      String(num(j.restarts)) + (num(j.preemptions) ? ' (+' + num(j.preemptions) + ' preempted)' : ''),
      duration(now - num(j.submit_ms)),
      { text: j.reason || '', cls: 'wrap' },
    ]));
    byId('jobs-empty').hidden = jobs.jobs.length > 0;
    const s = workers.summary || {};
    setText('worker-summary', num(s.workers) + ' workers: ' + num(s.alive) + ' alive, ' +
            num(s.lost) + ' lost; ' + num(s.slots) + ' slots, ' + num(s.free_slots) + ' free');
    fillTable(document.querySelector('#workers tbody'), (workers.workers || []).map((w) => {
      const state = workerState(w);
      return [
        w.name,
        { text: state, cls: 'state st-' + state.split(',').pop() },
        w.address || '-',
        { text: String(num(w.slots)), cls: 'num' },
        { text: String(num(w.free_slots)), cls: 'num' },
        gpus(w),
        { text: labels(w.labels), cls: 'wrap' },
        ago(num(w.last_heartbeat_ms), now),
        w.version || '-',
        { text: (w.jobs || []).join(' ') || '-', cls: 'wrap' },
      ];
    }));
  }

  // --- One job's page ------------------------------------------------------------

  function rankState(r) {
    if (!r.exited) return r.lost ? 'lost' : num(r.pid) ? 'running' : 'starting';
    if (num(r.signal)) return 'signal ' + num(r.signal);
    return 'exit ' + num(r.exit_code);
  }

  // Step metrics by rank, keyed by (attempt, global_step): what the charts draw. The
  // history is fetched whole now and then; each poll adds the ranks' latest points.
  const series = new Map();  // rank -> Map(key -> {attempt, step, loss, rate})

  function addPoint(m) {
    const rank = num(m.rank);
    if (!series.has(rank)) series.set(rank, new Map());
    const key = num(m.attempt) + ':' + num(m.global_step);
    series.get(rank).set(key, { attempt: num(m.attempt), step: num(m.global_step),
                                loss: Number(m.loss), rate: Number(m.samples_per_s) });
  }

  // An SVG line chart of `field` per rank over global steps, with each restart
  // (the first step of attempt 2, 3, ...) marked by a dashed line.
  function drawChart(container, field, digits) {
    const NS = 'http://www.w3.org/2000/svg';
    const W = 640, H = 260, L = 58, R = 12, T = 10, B = 28;
    const svg = document.createElementNS(NS, 'svg');
    svg.setAttribute('viewBox', '0 0 ' + W + ' ' + H);
    const add = (tag, attrs, text) => {
      const e = document.createElementNS(NS, tag);
      for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
      if (text !== undefined) e.textContent = text;
      svg.appendChild(e);
      return e;
    };
    const ranks = [...series.keys()].sort((a, b) => a - b);
    const lines = ranks.map((rank) => [...series.get(rank).values()]
        .filter((p) => Number.isFinite(p[field]))
        .sort((a, b) => a.attempt - b.attempt || a.step - b.step));
    const all = lines.flat();
    if (all.length === 0) {
      add('text', { x: W / 2, y: H / 2, 'text-anchor': 'middle' }, 'no steps reported yet');
      container.replaceChildren(svg);
      return;
    }
    let x0 = Math.min(...all.map((p) => p.step)), x1 = Math.max(...all.map((p) => p.step));
    let y0 = Math.min(...all.map((p) => p[field])), y1 = Math.max(...all.map((p) => p[field]));
    if (field === 'rate') y0 = 0;
    if (x1 === x0) x1 = x0 + 1;
    if (y1 === y0) { y1 += Math.abs(y1) * 0.1 || 1; }
    const sx = (x) => L + (x - x0) / (x1 - x0) * (W - L - R);
    const sy = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
    for (let i = 0; i <= 4; ++i) {
      const y = y0 + (y1 - y0) * i / 4;
      add('line', { x1: L, x2: W - R, y1: sy(y), y2: sy(y), class: 'grid' });
      add('text', { x: L - 6, y: sy(y) + 4, 'text-anchor': 'end' },
          digits === 0 ? thousands(y) : fixed(y, digits));
    }
    for (let i = 0; i <= 4; ++i) {
      const x = Math.round(x0 + (x1 - x0) * i / 4);
      add('text', { x: sx(x), y: H - 8, 'text-anchor': i === 4 ? 'end' : 'middle' }, String(x));
    }
    add('line', { x1: L, x2: L, y1: T, y2: H - B, class: 'axis' });
    add('line', { x1: L, x2: W - R, y1: H - B, y2: H - B, class: 'axis' });
    // Restarts: where each later attempt's points begin.
    const starts = new Map();
    for (const p of all) {
      if (p.attempt > 1 && (!starts.has(p.attempt) || p.step < starts.get(p.attempt))) {
        starts.set(p.attempt, p.step);
      }
    }
    for (const [attempt, step] of starts) {
      add('line', { x1: sx(step), x2: sx(step), y1: T, y2: H - B, class: 'restart' });
      add('text', { x: sx(step) + 3, y: T + 10 }, 'attempt ' + attempt);
    }
    ranks.forEach((rank, i) => {
      // One polyline per attempt, so a restart does not draw a line back in time.
      const byAttempt = new Map();
      for (const p of lines[i]) {
        if (!byAttempt.has(p.attempt)) byAttempt.set(p.attempt, []);
        byAttempt.get(p.attempt).push(sx(p.step).toFixed(1) + ',' + sy(p[field]).toFixed(1));
      }
      for (const pts of byAttempt.values()) {
        const pl = add('polyline', { points: pts.join(' ') });
        pl.style.stroke = COLORS[i % COLORS.length];
        pl.setAttribute('data-rank', String(rank));
      }
    });
    const legend = el('div', undefined, 'legend');
    ranks.forEach((rank, i) => {
      const item = el('span');
      const sw = el('span', undefined, 'swatch');
      sw.style.background = COLORS[i % COLORS.length];
      item.appendChild(sw);
      item.appendChild(document.createTextNode('rank ' + rank));
      legend.appendChild(item);
    });
    container.replaceChildren(svg, legend);
  }

  function renderJob(job, now) {
    document.title = 'ddp ' + job.id;
    setText('job-id', job.id);
    const state = byId('job-state');
    state.textContent = job.state;
    state.className = 'state st-' + job.state;
    const attempts = job.attempts || [];
    const current = attempts.length ? attempts[attempts.length - 1] : null;
    const start = num(job.start_ms), end = num(job.end_ms);
    setText('job-headline', (job.name ? job.name + '  ' : '') +
            (current ? 'attempt ' + current.number + '  world ' + num(current.world_size) + '  ' : '') +
            'elapsed ' + (start ? duration((end || now) - start) : '-'));
    setText('job-meta', 'owner ' + (job.owner || '-') + '  priority ' + num(job.priority) +
            '  restarts ' + num(job.restarts) + '/' + num(job.max_restarts) +
            (num(job.max_recoveries) ? '  live recoveries ' + num(job.recoveries) + '/' +
                                       num(job.max_recoveries) : '') +
            '  preemptions ' + num(job.preemptions) +
            (num(job.last_checkpoint_attempt) ? '  checkpoint step ' + num(job.last_checkpoint_step) +
                                                ' ' + ago(num(job.last_checkpoint_ms), now) : '') +
            (job.preemption_loss_ms === undefined ? ''
             : num(job.preemption_loss_ms) === 0 && job.preemption !== 'PREEMPT_KILL'
                 ? '  a preemption now loses nothing (at its next checkpoint)'
                 : '  a preemption now loses ' + duration(num(job.preemption_loss_ms))) +
            '  submitted ' + stamp(num(job.submit_ms)) +
            (Object.keys(job.node_selector || {}).length ? '  node_selector ' + labels(job.node_selector) : ''));
    setText('job-reason', job.reason || '');

    const metrics = new Map();
    let rate = 0;
    for (const m of job.metrics || []) {
      metrics.set(num(m.rank), m);
      rate += Number(m.samples_per_s) || 0;
      addPoint(m);
    }
    const progress = byId('job-progress');
    const r0 = metrics.get(0);
    const epochs = num(job.epochs);
    if (r0 && epochs > 0) {
      const steps = Math.max(1, num(r0.steps));
      const done = Math.min(1, (num(r0.epoch) + (num(r0.step) + 1) / steps) / epochs);
      const bar = el('span', undefined, 'bar');
      const fill = el('span');
      fill.style.width = (done * 100).toFixed(1) + '%';
      bar.appendChild(fill);
      progress.replaceChildren(
          document.createTextNode('epoch ' + Math.min(num(r0.epoch) + 1, epochs) + '/' + epochs + ' '),
          bar, document.createTextNode(Math.floor(done * 100) + '%  ' + thousands(rate) + ' samples/s'));
    } else {
      progress.replaceChildren();
    }
    const history = job.epoch_history || [];
    const last = history.length ? history[history.length - 1] : null;
    setText('job-epoch', last ? 'last epoch ' + num(last.epoch) + ': train_loss ' +
            fixed(last.train_loss, 4) + '  val_loss ' + fixed(last.val_loss, 4) +
            '  val_accuracy ' + (Number.isFinite(Number(last.val_accuracy))
                ? (Number(last.val_accuracy) * 100).toFixed(2) + '%' : '-') : '');

    fillTable(document.querySelector('#ranks tbody'), (current ? current.ranks || [] : []).map((r) => {
      const m = metrics.get(num(r.rank));
      return [
        String(num(r.rank)), r.worker || '-', rankState(r),
        m ? String(num(m.epoch)) : '-',
        m ? (num(m.step) + 1) + '/' + num(m.steps) : '-',
        m ? fixed(m.loss, 4) : '-',
        m ? thousands(m.samples_per_s) : '-',
        // Where the step went, when the rank says (the cell's tooltip).
        m ? { text: fixed(m.step_ms, 1),
              title: m.compute_ms === undefined ? undefined
                  : 'data ' + fixed(m.data_ms, 1) + '  compute ' + fixed(m.compute_ms, 1) +
                    '  communication ' + fixed(m.comm_ms, 1) + '  optimizer ' +
                    fixed(m.optimizer_ms, 1) + ' ms' } : '-',
        m ? fixed(m.comm_ms, 1) : '-',
        // The trainer's CUDA allocator (now/peak) and the worker's NVML; '-' on the CPU.
        m && m.gpu_memory_allocated_mib !== undefined
            ? fixed(m.gpu_memory_allocated_mib, 0) + '/' + fixed(m.gpu_memory_peak_mib, 0) : '-',
        r.gpu_utilization_pct !== undefined ? fixed(r.gpu_utilization_pct, 0) + '%' : '-',
        m ? ago(num(m.update_ms), now) : '-',
      ];
    }));
    fillTable(document.querySelector('#attempts tbody'), attempts.slice().reverse().map((a) => [
      String(a.number), { text: a.state + (a.preempted ? ' (preempted)' : ''), cls: 'state st-' + a.state },
      String(num(a.world_size)),
      [...new Set((a.ranks || []).map((r) => r.worker))].join(' ') || '-',
      stamp(num(a.start_ms)),
      num(a.start_ms) ? duration((num(a.end_ms) || now) - num(a.start_ms)) : '-',
      { text: [a.reason || ''].concat((a.recoveries || []).map((r) =>
          'live recovery ' + num(r.generation) + ': ' + (r.outcome || '') +
          (num(r.end_ms) ? ' in ' + duration(num(r.end_ms) - num(r.start_ms)) : '') +
          ' - ' + (r.cause || ''))).filter((t) => t).join('; '), cls: 'wrap' },
    ]));
    fillTable(document.querySelector('#epochs tbody'), history.slice(-10).reverse().map((e) => [
      String(num(e.attempt)), String(num(e.epoch)), fixed(e.train_loss, 4), fixed(e.val_loss, 4),
      Number.isFinite(Number(e.val_accuracy)) ? (Number(e.val_accuracy) * 100).toFixed(2) + '%' : '-',
      ago(num(e.time_ms), now),
    ]));
    drawChart(byId('chart-loss'), 'loss', 4);
    drawChart(byId('chart-speed'), 'rate', 0);
  }

  function renderLogs(lines) {
    const pre = byId('logs');
    const stick = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    pre.textContent = (lines || []).map((l) =>
        '[' + num(l.attempt) + '/' + num(l.rank) + (l.stream === 'stderr' ? ' err' : '') + '] ' +
        l.text).join('\n') || '(no output yet)';
    if (stick) pre.scrollTop = pre.scrollHeight;
  }

  function jobPage() {
    const id = decodeURIComponent(location.pathname.replace(/^\/jobs\//, ''));
    const base = '/api/jobs/' + encodeURIComponent(id);
    let nextHistory = 0;
    let finished = false;
    poll(async () => {
      if (finished) return;
      const wantHistory = Date.now() >= nextHistory;
      const [reply, logs] = await Promise.all([
        api(base + (wantHistory ? '?history=1' : '')),
        api(base + '/logs?tail=' + LOG_LINES),
      ]);
      if (wantHistory) {
        const history = reply.job.history || [];
        for (const m of history) addPoint(m);
        nextHistory = Date.now() +
            Math.min(HISTORY_MAX_MS, Math.max(POLL_MS, history.length / HISTORY_POINTS_PER_S * 1000));
      }
      renderJob(reply.job, num(reply.now_ms));
      renderLogs(logs.lines);
      // A finished job changes no more: one last full read, then stop polling.
      if (['SUCCEEDED', 'FAILED', 'CANCELLED'].includes(reply.job.state)) {
        if (wantHistory) finished = true; else nextHistory = 0;
      }
    });
  }

  document.addEventListener('DOMContentLoaded', () => {
    if (document.body.dataset.page === 'job') jobPage(); else poll(indexTick);
  });
})();

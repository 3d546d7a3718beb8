// trainbus dashboard: follows a run's server-sent events (no polling, no build step).
//
// Cheap by design, so that a tab open next to a training run takes little CPU from it:
// - the server coalesces the stream into at most 4 messages a second (?pack=1&rate=4), each
//   a JSON array of what arrived meanwhile: the page's work does not grow with the events;
// - EventSource handlers only queue the raw message; a frame (requestAnimationFrame, at most
//   every FRAME_MS = 250 ms) parses the queue, folds it into the series and redraws only what
//   changed (a dirty flag per part): each chart once, header texts only when they differ;
// - a hidden tab folds data in but draws nothing (no frames); it draws once when shown;
// - series keep at most MAX_POINTS points: past that, neighbouring points are averaged in
//   pairs (old points get coarser), so memory and the cost of a redraw stay flat;
// - the callbacks table keeps one row per callback and updates its cells in place (no DOM
//   rebuilt, no layout of the whole page); the timeline is one canvas, resized only when
//   its size changes.
"use strict";
(function () {
  const MAX_POINTS = 2000;
  const FRAME_MS = 250;
  const EVENTS = ["init", "fit_start", "epoch_start", "batch_end", "epoch_end", "eval_start",
    "eval_end", "fit_end", "metrics", "hyperparameters", "bus", "gap", "end", "disconnected"];
  const UNNUMBERED = new Set(["end", "gap", "disconnected"]);
  const D = {
    status: "connecting", lastSeq: -1, duplicates: 0, duplicateSeqs: [], received: 0, reconnects: 0,
    frames: 0, firstFrameAt: null, lastFrameAt: null, messages: 0,
    dropped: 0, epoch: 0, batch: 0, ended: null,
    loss: { x: [], y: [], count: 0, steps: [] },
    evals: { x: [], names: [], ys: {} },
    speed: { x: [], y: [] },
    bus: null, slowest: null, eventsPerSec: 0,
    account: { step: null, parts: {} },  // the time account's latest time/... values
  };
  window.trainbusDashboard = D;

  const $ = (id) => document.getElementById(id);
  let queue = [];
  const dirty = { loss: false, eval: false, speed: false, bus: false, header: false,
                  account: false };
  // The time account's parts (Trainer.time_account, logged as time/<part> seconds).
  const ACCOUNT_PARTS = ["startup", "data", "compute", "evaluation", "checkpoint",
    "callbacks", "bus", "replayed", "close", "other"];
  let startWall = null;
  const recentBatches = [];  // [wall_time, batch] of the last second or so
  let lastSpeedAt = 0;
  const rateWindow = [];

  function num(v) {
    const n = typeof v === "number" ? v : Number(v);
    return Number.isFinite(n) ? n : null;
  }

  function compact(xs, ys) {  // average neighbours in pairs: half the points, same span
    const nx = [], ny = [];
    for (let i = 0; i + 1 < xs.length; i += 2) {
      nx.push(xs[i + 1]);
      const a = ys[i], b = ys[i + 1];
      ny.push(a === null ? b : b === null ? a : (a + b) / 2);
    }
    if (xs.length % 2) { nx.push(xs[xs.length - 1]); ny.push(ys[ys.length - 1]); }
    return [nx, ny];
  }

  function pushPoint(series, x, y) {
    series.x.push(x);
    series.y.push(y);
    if (series.x.length > MAX_POINTS) [series.x, series.y] = compact(series.x, series.y);
  }

  function onMetrics(data) {
    const m = data.metrics || {};
    for (const name in m) {
      const value = m[name];
      if (name === "loss/train") {
        pushPoint(D.loss, data.step, num(value));
        D.loss.count += 1;
        if (D.loss.steps.length < 100000) D.loss.steps.push(data.step);
        dirty.loss = true;
      } else if (name.startsWith("time/") && !name.startsWith("time/callback/")) {
        const v = num(value);
        if (v !== null) D.account.parts[name.slice(5)] = v;
        D.account.step = data.step;
        dirty.account = true;
      } else if (name.startsWith("eval/")) {
        const ev = D.evals;
        if (!(name in ev.ys)) {
          ev.names.push(name);
          ev.ys[name] = ev.x.map(() => null);
          evalChart = null;  // a new series: rebuild the chart
        }
        if (ev.x.length === 0 || ev.x[ev.x.length - 1] !== data.step) {
          ev.x.push(data.step);
          for (const n of ev.names) ev.ys[n].push(null);
        }
        ev.ys[name][ev.ys[name].length - 1] = num(value);
        dirty.eval = true;
      }
    }
  }

  function onBatchEnd(data) {
    D.batch = data.batch;
    D.epoch = data.epoch;
    const t = data.wall_time;
    if (startWall === null) startWall = t;
    recentBatches.push([t, data.batch]);
    while (recentBatches.length > 2 && t - recentBatches[0][0] > 1.0) recentBatches.shift();
    if (t - lastSpeedAt >= 0.25 && recentBatches.length >= 2) {
      const [t0, b0] = recentBatches[0];
      if (t > t0) {
        pushPoint(D.speed, t - startWall, (data.batch - b0) / (t - t0));
        lastSpeedAt = t;
        dirty.speed = true;
      }
    }
    dirty.header = true;
  }

  function handle(name, raw, id) {
    if (name === "items") {
      for (const d of JSON.parse(raw)) {
        const kind = d.type === "event" ? d.event : d.type;
        handleData(kind, d, d.seq === undefined ? "" : String(d.seq));
      }
      return;
    }
    handleData(name, JSON.parse(raw), id);
  }

  function handleData(name, data, id) {
    // end, gap and disconnected carry no id (their lastEventId repeats the previous one).
    if (!UNNUMBERED.has(name) && id !== "" && id !== undefined) {
      const seq = Number(id);
      if (seq <= D.lastSeq) {
        D.duplicates += 1;
        if (D.duplicateSeqs.length < 100) D.duplicateSeqs.push([name, seq, D.lastSeq]);
        return;
      }
      D.lastSeq = seq;
    }
    D.received += 1;
    if (name === "metrics") onMetrics(data);
    else if (name === "batch_end") onBatchEnd(data);
    else if (name === "bus") { D.bus = data; dirty.bus = true; }
    else if (name === "gap") { D.dropped += data.missed; dirty.header = true; }
    else if (name === "epoch_start" || name === "epoch_end") { D.epoch = data.epoch; dirty.header = true; }
    else if (name === "end" || name === "disconnected") {
      D.ended = data;
      setStatus(name === "end" ? (data.status === "completed" ? "finished" : data.status) : "disconnected");
      source.close();  // otherwise EventSource reconnects
    }
  }

  // -- frames: at most one every FRAME_MS, none while the tab is hidden -----------------

  let lastFrame = -Infinity;
  let timer = null;
  let frameRequested = false;

  function fold() {  // parse what waits in the queue into the series (no drawing)
    const batch = queue;
    queue = [];
    let items = 0;
    for (const [name, raw, id] of batch) {
      const before = D.received;
      try { handle(name, raw, id); } catch (err) { console.warn("trainbus dashboard:", err); }
      items += D.received - before;
    }
    const now = performance.now();
    rateWindow.push([now, items]);
    while (rateWindow.length && now - rateWindow[0][0] > 1000) rateWindow.shift();
    let sum = 0;
    for (const r of rateWindow) sum += r[1];
    D.eventsPerSec = sum;
  }

  function frame() {
    frameRequested = false;
    fold();
    if (document.hidden) return;  // drawn when shown again (visibilitychange)
    const now = performance.now();
    lastFrame = now;
    render();
    D.frames += 1;
    if (D.firstFrameAt === null) D.firstFrameAt = now;
    D.lastFrameAt = now;
  }

  function schedule() {
    if (frameRequested || timer !== null) return;
    const wait = lastFrame + FRAME_MS - performance.now();
    if (wait > 0) {
      timer = setTimeout(() => { timer = null; request(); }, wait);
    } else {
      request();
    }
  }

  function request() {
    if (document.hidden) { fold(); return; }  // hidden tabs get no animation frames
    frameRequested = true;
    requestAnimationFrame(frame);
  }

  document.addEventListener("visibilitychange", () => {
    if (!document.hidden) { dirty.header = true; schedule(); }
  });

  // -- charts ---------------------------------------------------------------------------

  function chartOpts(el, series, xLabel) {
    return {
      width: Math.max(300, el.clientWidth), height: 220,
      scales: { x: { time: false } },
      axes: [{ label: xLabel }, {}],
      legend: { live: false },
      cursor: { drag: { x: false, y: false } },
      series: [{ label: xLabel }, ...series],
    };
  }
  const COLORS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860"];
  const lossChart = new uPlot(
    chartOpts($("loss-chart"), [{ label: "loss/train", stroke: COLORS[0], width: 1.5 }], "batch"),
    [[], []], $("loss-chart"));
  const speedChart = new uPlot(
    chartOpts($("speed-chart"), [{ label: "batches/s", stroke: COLORS[2], width: 1.5 }], "seconds"),
    [[], []], $("speed-chart"));
  let evalChart = null;

  function renderEval() {
    const ev = D.evals;
    if (!ev.names.length) return;
    if (evalChart === null) {
      $("eval-chart").textContent = "";
      const series = ev.names.map((n, i) => ({
        label: n, stroke: COLORS[(i + 1) % COLORS.length], width: 1.5, points: { show: true },
      }));
      evalChart = new uPlot(chartOpts($("eval-chart"), series, "batch"), [[]], $("eval-chart"));
    }
    evalChart.setData([ev.x, ...ev.names.map((n) => ev.ys[n])]);
  }

  function fmtTime(s) {
    if (s >= 1) return s.toFixed(2) + " s";
    if (s >= 1e-3) return (s * 1e3).toFixed(1) + " ms";
    return (s * 1e6).toFixed(0) + " µs";
  }

  function setText(el, text) {  // touch the DOM only when the text changes
    if (el.textContent !== text) el.textContent = text;
  }

  const tableRows = new Map();  // callback name -> <tr>

  function renderBus() {
    const stats = D.bus.statistics;
    const estimated = new Set(stats.estimated || []);
    const rows = [...stats.callbacks].sort((a, b) => b.total_time - a.total_time);
    D.slowest = rows.length && rows[0].total_time > 0 ? rows[0].name : null;
    setText($("slowest"), D.slowest || "-");
    const body = $("callbacks").querySelector("tbody");
    const mark = (field, text) => (estimated.has(field) ? "≈ " + text : text);
    rows.forEach((c, i) => {
      let tr = tableRows.get(c.name);
      if (tr === undefined) {
        tr = document.createElement("tr");
        tr.dataset.callback = c.name;
        for (let k = 0; k < 8; k++) tr.appendChild(document.createElement("td"));
        tableRows.set(c.name, tr);
      }
      if (body.children[i] !== tr) body.insertBefore(tr, body.children[i] || null);
      const slowest = c.name === D.slowest ? "slowest" : "";
      if (tr.className !== slowest) tr.className = slowest;
      const records = c.peak_pending_records  // a logger: its queued records too
        ? `; records ${c.pending_records} (${c.peak_pending_records})` : "";
      const cells = [c.name, fmtTime(c.total_time), fmtTime(c.mean_time), fmtTime(c.max_time),
        String(c.handled), mark("lag_batches", String(c.lag_batches)),
        `${c.pending} (${c.peak_pending})${records}`,
        mark("barrier_wait_caused", fmtTime(c.barrier_wait_caused))];
      for (let k = 0; k < cells.length; k++) setText(tr.children[k], cells[k]);
    });
    // The figures are as of the batch the snapshot was taken at (the header's batch may be
    // ahead of it): say which, instead of a count of the bus's own that could contradict it.
    const asOf = stats.batch === undefined ? stats.batches : stats.batch;
    setText($("bus-as-of"), `as of batch ${asOf}`);
    setText($("bus-summary"),
      `As of batch ${asOf}: training waited ${fmtTime(stats.barrier_wait_time)} at barriers ` +
      `(${stats.barrier_waits} waits) and ${fmtTime(stats.backpressure_wait_time)} for full queues; ` +
      `handlers ran ${fmtTime(stats.handler_time)} in all; queue depth ${stats.queue_depth}.` +
      (estimated.size ? " ≈: estimated from the timeline." : ""));
    renderTimeline();
  }

  let canvasSize = "";
  // The timeline's colours, one per kind of span; the legend under it is drawn from this
  // table too, so the two cannot drift apart.
  const TIMELINE = [
    { key: "batch", color: "#4c72b0", text: "training thread: computing a batch" },
    { key: "wait", color: "#dd8452", text: "training thread: waiting for callbacks (barrier or full queue)" },
    { key: "handler", color: "#55a868", text: "a callback's handler running" },
  ];
  const TIMELINE_COLOR = Object.fromEntries(TIMELINE.map((k) => [k.key, k.color]));
  D.timelineLegend = TIMELINE;

  function spanKind(s) {
    if (s.row !== "training thread") return "handler";
    return s.label.startsWith("wait") ? "wait" : "batch";
  }

  (function drawLegend() {
    const legend = $("timeline-legend");
    for (const k of TIMELINE) {
      const item = document.createElement("span");
      item.className = "legend-item";
      item.dataset.kind = k.key;
      const swatch = document.createElement("span");
      swatch.className = "swatch";
      swatch.style.background = k.color;
      item.append(swatch, document.createTextNode(k.text));
      legend.appendChild(item);
    }
  })();

  function renderTimeline() {
    const canvas = $("timeline");
    const spans = D.bus.timeline || [];
    const names = ["training thread", ...D.bus.statistics.callbacks.map((c) => c.name)];
    const rowH = 22, left = 150, height = names.length * rowH + 20;
    const width = canvas.clientWidth || 800;
    const ratio = window.devicePixelRatio || 1;
    const size = `${width}x${height}x${ratio}`;
    if (size !== canvasSize) {  // a new size reallocates the canvas: only when it changes
      canvasSize = size;
      canvas.width = width * ratio;
      canvas.height = height * ratio;
      canvas.style.height = height + "px";
    }
    const g = canvas.getContext("2d");
    g.setTransform(ratio, 0, 0, ratio, 0, 0);
    g.clearRect(0, 0, width, height);
    g.font = "12px system-ui, sans-serif";
    g.textBaseline = "middle";
    g.fillStyle = "#1d2330";
    names.forEach((n, i) => g.fillText(n, 4, i * rowH + rowH / 2));
    if (!spans.length) return;
    let t0 = Infinity, t1 = -Infinity;
    for (const s of spans) { t0 = Math.min(t0, s.start); t1 = Math.max(t1, s.start + s.dur); }
    const scale = (width - left - 10) / Math.max(t1 - t0, 1e-3);
    const rowOf = new Map(names.map((n, i) => [n, i]));
    for (const s of spans) {
      const row = rowOf.get(s.row);
      if (row === undefined) continue;
      g.fillStyle = TIMELINE_COLOR[spanKind(s)];
      g.fillRect(left + (s.start - t0) * scale, row * rowH + 3, Math.max(1, s.dur * scale), rowH - 6);
    }
    g.fillStyle = "#6b7280";
    g.fillText(`${(t1 - t0).toFixed(1)} ms`, width - 60, height - 10);
  }

  function renderAccount() {  // one line: each part's share of the wall time so far
    const a = D.account.parts, wall = a.wall;
    if (!(wall > 0)) return;
    const shown = ACCOUNT_PARTS.filter((p) => a[p] > 0.0005)
      .map((p) => `${p} ${(100 * a[p] / wall).toFixed(1)}%`);
    const off = a.off_thread || 0, hidden = a.hidden || 0;
    const share = off > 0 ? `, ${Math.round(100 * hidden / off)}% of callback work hidden` : "";
    setText($("account"), `${wall.toFixed(2)} s to batch ${D.account.step}: ` +
      shown.join(" · ") + share);
  }

  function render() {
    if (dirty.loss) lossChart.setData([D.loss.x, D.loss.y]);
    if (dirty.speed) speedChart.setData([D.speed.x, D.speed.y]);
    if (dirty.eval) renderEval();
    if (dirty.bus && D.bus) renderBus();
    if (dirty.account) renderAccount();
    setText($("epoch"), String(D.epoch));
    setText($("batch"), String(D.batch));
    setText($("dropped"), String(D.dropped));
    setText($("rate"), String(D.eventsPerSec));
    const sp = D.speed.y.length ? D.speed.y[D.speed.y.length - 1] : null;
    setText($("throughput"), sp === null ? "-" : sp.toFixed(1));
    for (const k in dirty) dirty[k] = false;
  }

  function setStatus(s) {
    D.status = s;
    const el = $("status");
    setText(el, s);
    el.className = "pill " + s;
  }

  window.addEventListener("resize", () => {
    for (const [chart, el] of [[lossChart, "loss-chart"], [speedChart, "speed-chart"],
      [evalChart, "eval-chart"]]) {
      if (chart) chart.setSize({ width: Math.max(300, $(el).clientWidth), height: 220 });
    }
    if (D.bus) renderTimeline();
  });

  // -- the stream -----------------------------------------------------------------------

  // ?pack=1&rate=4: at most four `items` messages a second, each a JSON array of items.
  const source = new EventSource("events?since=0&bus=1&pack=1&rate=4&buffer=20000");
  source.onopen = () => { if (!D.ended) setStatus("live"); };
  source.onerror = () => {
    if (D.ended) return;
    if (source.readyState === EventSource.CONNECTING) { D.reconnects += 1; setStatus("reconnecting"); }
    else setStatus("closed");
  };
  const enqueue = (name) => (e) => {
    D.messages += 1;
    queue.push([name, e.data, e.lastEventId]);
    schedule();
  };
  source.addEventListener("items", enqueue("items"));
  for (const name of EVENTS) source.addEventListener(name, enqueue(name));
})();

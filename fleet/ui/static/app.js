// fleet ui: the page's one script (Lab, Runs, a Run), rendered from data-page on <body>.
// Plots: uPlot 1.6.32 (vendored from npm `uplot`, MIT, see uplot.LICENSE), no other library.
// Every text that comes from a node or a person goes in through textContent / text nodes only:
// nothing here parses markup.
"use strict";

(function () {
  const body = document.body;
  const TOKEN = body.dataset.token || "";
  const PAGE = body.dataset.page || "lab";
  const RUN = body.dataset.run || "";
  const MAX_LINES = 20000; // the log keeps its newest lines; older ones leave the page

  // ---- small helpers ---------------------------------------------------------------------------
  function withToken(path) {
    return path + (path.includes("?") ? "&" : "?") + "token=" + encodeURIComponent(TOKEN);
  }

  // el("td", {class: "state", data: {host: h}}, "text", child...): children are strings (text
  // nodes) or nodes; attributes are set one by one, never parsed.
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "data") Object.entries(v).forEach(([dk, dv]) => { node.dataset[dk] = String(dv); });
      else if (k === "text") node.textContent = String(v);
      else node.setAttribute(k, String(v));
    }
    for (const c of children) {
      if (c === null || c === undefined || c === false) continue;
      node.appendChild(typeof c === "object" ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  function clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
    return node;
  }

  function $(id) { return document.getElementById(id); }

  // The banner: what failed last, kept until what it came from (a fetch's path, an action)
  // goes well again; a look that went well does not hide a button's failure.
  function showError(words, source) {
    const e = $("error");
    e.textContent = words;
    e.dataset.source = source || "";
    e.hidden = false;
    showDone("");
  }

  function hideError(source) {
    const e = $("error");
    if (!source || e.dataset.source === source) e.hidden = true;
  }

  function showDone(words) {
    const d = $("done");
    d.textContent = words;
    d.hidden = !words;
  }

  // Why the server said no: its JSON's words (a FleetError: {"error", "exit_code"}), else its text.
  async function refusal(r) {
    const text = await r.text();
    try {
      const said = JSON.parse(text);
      if (said && said.error) return `${said.error}` + (said.exit_code !== undefined ? ` (exit code ${said.exit_code})` : "");
    } catch (e) { /* not JSON: its text */ }
    return `${r.status} ${text.slice(0, 300)}`;
  }

  // A GET's JSON; a failure is said in the banner (and thrown), a success clears its own.
  async function getJson(path) {
    const source = path.split("?")[0];
    let r;
    try {
      r = await fetch(withToken(path), { headers: { "X-Fleet-Token": TOKEN } });
    } catch (e) {
      const words = `${path}: the server did not answer (${e.message}); is fleet ui still running?`;
      showError(words, source);
      throw new Error(words);
    }
    if (!r.ok) {
      const words = `${path}: ${await refusal(r)}`;
      showError(words, source);
      throw new Error(words);
    }
    hideError(source);
    return r.json();
  }

  // An action: POST with the token in its header (a token in the URL is refused there), then its words.
  async function post(path, payload) {
    showDone("");
    let r;
    try {
      r = await fetch(withToken(path), {
        method: "POST",
        headers: { "X-Fleet-Token": TOKEN, "Content-Type": "application/json" },
        body: JSON.stringify(payload || {}),
      });
    } catch (e) {
      showError(`${path}: the server did not answer (${e.message})`, "action");
      return null;
    }
    if (!r.ok) {
      showError(`${path}: ${await refusal(r)}`, "action");
      return null;
    }
    let said = null;
    try { said = await r.json(); } catch (e) { said = null; }
    if (!said || !said.ok) {
      const words = said && said.words ? said.words : "no answer";
      const code = said && said.exit_code !== undefined ? ` (exit code ${said.exit_code})` : "";
      showError(`${path}: ${words}${code}`, "action");
      return said;
    }
    hideError("action");
    showDone(said.words || "done");
    return said;
  }

  function span(seconds) { // as fleet says an age: 40 s, 12 min, 3 h 5 min, 14 h, 2 d
    if (seconds === null || seconds === undefined || !isFinite(seconds)) return "";
    const s = Math.max(Math.round(seconds), 0);
    if (s < 60) return `${s} s`;
    if (s < 3600) return `${Math.floor(s / 60)} min`;
    if (s < 36000) {
      const m = Math.floor((s % 3600) / 60);
      return `${Math.floor(s / 3600)} h` + (m ? ` ${m} min` : "");
    }
    if (s < 86400 * 2) return `${Math.floor(s / 3600)} h`;
    return `${Math.floor(s / 86400)} d`;
  }

  function when(epoch) {
    if (epoch === null || epoch === undefined) return "";
    const d = new Date(epoch * 1000);
    const p = (n) => String(n).padStart(2, "0");
    const today = new Date();
    const hm = `${p(d.getHours())}:${p(d.getMinutes())}`;
    if (d.toDateString() === today.toDateString()) return `${hm}:${p(d.getSeconds())}`;
    return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${hm}`;
  }

  function gib(mib) {
    return mib === null || mib === undefined ? "?" : (mib / 1024).toFixed(1);
  }

  // A state's first word (`unknown (node1 unreachable)` is unknown): its colour and its filter.
  function stateWord(word) {
    return String(word || "unknown").split(/[\s(:]/)[0].replace(/[^a-z_-]/gi, "") || "unknown";
  }

  function stateClass(word) {
    return "state state-" + stateWord(word);
  }

  const PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
    "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];

  // A uPlot chart that is rebuilt when its series change and refreshed (at most a few times a
  // second) when only their values do.
  class Chart {
    constructor(target, xLabel, yLabel, yRange) {
      this.target = target;
      this.yRange = yRange || null;
      this.xLabel = xLabel;
      this.yLabel = yLabel;
      this.plot = null;
      this.names = [];
      this.pending = null;
      window.addEventListener("resize", () => {
        if (this.plot) this.plot.setSize(this.size());
      });
    }

    size() { return { width: Math.max(this.target.clientWidth - 10, 300), height: 220 }; }

    // make() gives {names, data} when the chart is drawn: values may come faster than frames.
    show(make, timeX) {
      this.pending = { make, timeX };
      if (this.timer) return;
      this.timer = setTimeout(() => { this.timer = null; this.draw(); }, 250);
    }

    draw() {
      const { make, timeX } = this.pending;
      const { names, data } = make();
      if (typeof uPlot === "undefined") {
        this.target.textContent = "(the plotting library did not load)";
        return;
      }
      if (this.plot && names.join("\u0000") === this.names.join("\u0000")) {
        this.plot.setData(data);
        return;
      }
      if (this.plot) this.plot.destroy();
      clear(this.target);
      this.names = names.slice();
      const series = [{ label: this.xLabel }].concat(names.map((n, i) => ({
        label: n, stroke: PALETTE[i % PALETTE.length], width: 1.5, spanGaps: true,
        points: { show: timeX }, // a look every few seconds: each one a dot; a log's values: a line
      })));
      const opts = Object.assign(this.size(), {
        scales: this.yRange ? { x: { time: timeX }, y: { range: this.yRange } } : { x: { time: timeX } },
        series,
        axes: [{ label: timeX ? "" : this.xLabel }, { label: this.yLabel }],
        legend: { live: true },
      });
      this.plot = new uPlot(opts, data, this.target);
    }
  }

  // ---- navigation ------------------------------------------------------------------------------
  function nav() {
    for (const [id, page] of [["nav-lab", "lab"], ["nav-runs", "runs"]]) {
      const a = $(id);
      a.href = withToken(a.getAttribute("href"));
      if (page === PAGE) a.classList.add("here");
    }
  }

  // A stream of server-sent events, with words in the header on whether it is live.
  function stream(path, handlers) {
    const live = $("live");
    const es = new EventSource(withToken(path));
    let opened = 0;
    es.addEventListener("open", () => {
      live.textContent = "live";
      live.className = "live on";
      if (opened++ && handlers.reopened) handlers.reopened();
    });
    es.addEventListener("error", () => {
      if (es.readyState === EventSource.CLOSED) {
        live.textContent = "not live (reload the page)";
      } else {
        live.textContent = "reconnecting…";
      }
      live.className = "live off";
    });
    for (const [name, fn] of Object.entries(handlers)) {
      if (name === "reopened") continue;
      es.addEventListener(name, (m) => {
        let data = null;
        try { data = m.data ? JSON.parse(m.data) : null; } catch (e) { return; }
        fn(data, es);
      });
    }
    return es;
  }

  // ---- Lab ---------------------------------------------------------------------------------------
  // `hosts` as `fleet gpus --json` prints it: {"hosts": [{host, gpus, leases, error...}]}; also
  // taken as a plain list of those, or an object keyed by host.
  function hostList(hosts) {
    if (!hosts) return [];
    if (Array.isArray(hosts)) return hosts;
    if (Array.isArray(hosts.hosts)) return hosts.hosts;
    return Object.entries(hosts).map(([name, h]) => Object.assign({ host: name }, h));
  }

  function leaseWords(l) {
    const what = l.gpus === null || l.gpus === undefined ? "whole host" : `GPU ${l.gpus.join(",")}`;
    const until = l.until ? ` until ${when(l.until)} (${span(l.until - Date.now() / 1000)} left)` : "";
    return `${l.owner || "?"}: ${what}${until}` + (l.note ? `: "${l.note}"` : "");
  }

  function holderNode(p) {
    const who = el("div", { class: "holder" },
      el("span", { class: "user" }, p.user || "?"), " ",
      el("span", { class: "pid" }, `pid ${p.pid}`), " ",
      el("span", { class: "mem muted" }, `${gib(p.memory_mib)} GiB`));
    if (p.age_s !== null && p.age_s !== undefined) who.append(" ", el("span", { class: "muted" }, span(p.age_s)));
    if (p.run) {
      who.append(" ", el("a", { class: "run", href: withToken("/run/" + encodeURIComponent(p.run)) }, p.run));
    }
    if (p.command) who.title = p.command;
    return who;
  }

  function gpuRow(inv, h, g) {
    const used = g.memory_used_mib || 0;
    const total = g.memory_total_mib || 0;
    const pct = total ? Math.min(100, Math.round((100 * used) / total)) : 0;
    const bar = el("div", { class: "bar" }, el("div", { class: "fill" }));
    bar.firstChild.style.width = pct + "%";
    const procs = g.processes || g.apps || [];
    const holders = el("td", { class: "holders" }, ...procs.map(holderNode));
    const leases = (h.leases || []).filter((l) => l.gpus && l.gpus.includes(g.index));
    const idle = procs.some((p) => p.idle);
    const util = g.utilization !== undefined ? g.utilization : g.util;
    const reserve = el("button", { type: "button", class: "reserve" }, "reserve");
    const release = el("button", { type: "button", class: "release" }, "release");
    reserve.addEventListener("click", () => reserveGpu(inv, h.host, g.index));
    release.addEventListener("click", () => releaseGpu(inv, h.host, g.index));
    return el("tr", { data: { host: h.host, gpu: g.index, inventory: inv }, class: procs.length ? "held" : "free" },
      el("td", { class: "host" }, h.host),
      el("td", { class: "gpu" }, String(g.index), " ", el("span", { class: "muted" }, g.name || "")),
      el("td", { class: "memory" }, bar, `${gib(used)} / ${gib(total)} GiB`),
      el("td", { class: "util" }, util === null || util === undefined ? "n/a" : `${util}%`),
      holders.childNodes.length ? holders : el("td", { class: "holders muted" }, "free"),
      el("td", { class: "leases" }, ...leases.map((l) => el("div", {}, leaseWords(l)))),
      el("td", { class: "idle-cell" }, idle ? el("span", { class: "idle", title:
        "a process holds memory here for an hour or more with the GPU at 0% at this look" }, "idle?") : ""),
      el("td", { class: "buttons" }, reserve, " ", release));
  }

  function hostRow(inv, h, words, cls, button) {
    return el("tr", { data: { host: h.host, inventory: inv }, class: cls },
      el("td", { class: "host" }, h.host), el("td", { colspan: 6, class: "note" }, words),
      el("td", { class: "buttons" }, button || ""));
  }

  function renderLab(lab) {
    const tbody = clear($("lab").tBodies[0]);
    if (!(lab.inventories || []).length) {
      tbody.appendChild(el("tr", {}, el("td", { colspan: 8, class: "muted" },
        "no inventory to show: start fleet ui with -i INVENTORY (or run a job here first)")));
    }
    for (const inv of lab.inventories || []) {
      tbody.appendChild(el("tr", { class: "inventory" },
        el("th", { colspan: 8 }, inv.path, inv.error ? el("span", { class: "bad" }, `: ${inv.error}`) : "")));
      for (const h of hostList(inv.hosts)) {
        if (h.error && !("nvidia_smi" in h)) { // never asked: why is all there is
          tbody.appendChild(hostRow(inv.path, h, `not asked: ${h.error}`, "bad"));
          continue;
        }
        if (h.nvidia_smi === false) {
          tbody.appendChild(hostRow(inv.path, h, "no nvidia-smi here (no NVIDIA GPU)", "muted"));
        } else if (h.error || !(h.gpus || []).length) { // the GPUs it did list follow
          tbody.appendChild(hostRow(inv.path, h, `nvidia-smi failed: ${h.error || "it lists no GPU"}`, "bad"));
        }
        if (h.leases_unknown) tbody.appendChild(hostRow(inv.path, h, `leases unknown: ${h.leases_unknown}`, "warn"));
        for (const l of (h.leases || []).filter((l) => !l.gpus)) {
          let button = null;
          if (h.user && l.owner === h.user) { // one's own lease of the whole host
            button = el("button", { type: "button", class: "release" }, "release host");
            button.addEventListener("click", () => releaseGpu(inv.path, h.host, null));
          }
          tbody.appendChild(hostRow(inv.path, h, `leased: ${leaseWords(l)}`, "warn", button));
        }
        for (const g of h.gpus || []) tbody.appendChild(gpuRow(inv.path, h, g));
      }
    }
    $("lab-at").textContent = lab.at ? `Last look: ${when(lab.at)}.` : "";
  }

  async function reserveGpu(inv, host, index) {
    const wanted = $("reserve-for").value.trim() || "2h";
    const note = $("reserve-note").value.trim();
    if (!confirm(`Reserve GPU ${index} on ${host} for ${wanted}?`)) return;
    await post("/api/reserve", { inventory: inv, host, gpus: [index], for: wanted, note });
  }

  async function releaseGpu(inv, host, index) { // index null: the whole host
    const what = index === null ? `the whole of ${host}` : `GPU ${index} of ${host}`;
    if (!confirm(`Release your lease on ${what}?`)) return;
    await post("/api/release", { inventory: inv, host, gpus: index === null ? null : [index] });
  }

  function lab() {
    const chart = new Chart($("lab-plot"), "time", "GPU use %", [0, 100]);
    const xs = [];
    const byHost = new Map(); // host -> values, aligned with xs (null where not seen)
    let lastAt = null;

    function addPoint(look) {
      if (look.at === lastAt) return;
      lastAt = look.at;
      const means = new Map();
      for (const inv of look.inventories || []) {
        for (const h of hostList(inv.hosts)) {
          const utils = (h.gpus || []).map((g) => (g.utilization !== undefined ? g.utilization : g.util))
            .filter((u) => typeof u === "number");
          if (utils.length) means.set(h.host, utils.reduce((a, b) => a + b, 0) / utils.length);
        }
      }
      xs.push(look.at || Date.now() / 1000);
      for (const host of means.keys()) {
        if (!byHost.has(host)) byHost.set(host, new Array(xs.length - 1).fill(null));
      }
      for (const [host, values] of byHost) values.push(means.has(host) ? means.get(host) : null);
      const names = [...byHost.keys()];
      if (names.length) chart.show(() => ({ names, data: [xs.slice(), ...names.map((n) => byHost.get(n).slice())] }), true);
      else $("lab-plot").textContent = "no GPU seen yet";
    }

    function look(data) {
      if (data.error) showError(`the lab: ${data.error}`, "lab");
      else hideError("lab");
      renderLab(data);
      addPoint(data);
    }

    getJson("/api/lab").then(look).catch(() => {});
    stream("/api/lab/stream", { lab: look });
  }

  // ---- Runs --------------------------------------------------------------------------------------
  function runs() {
    const filter = $("runs-filter");
    const stateSel = $("runs-state");

    let older = "";  // the runs the server left out, and the damaged records it skipped
    function apply() {
      const q = filter.value.trim().toLowerCase();
      const st = stateSel.value;
      let shown = 0;
      const rows = [...$("runs").tBodies[0].rows].filter((tr) => tr.dataset.run !== undefined);
      for (const tr of rows) {
        const ok = (!q || tr.textContent.toLowerCase().includes(q)) && (!st || tr.dataset.state === st);
        tr.hidden = !ok;
        if (ok) shown++;
      }
      $("runs-count").textContent = `${shown} of ${rows.length} runs${older}`;
    }

    getJson("/api/runs").then((data) => {
      const tbody = clear($("runs").tBodies[0]);
      const states = new Set();
      for (const r of data.runs || []) {
        states.add(stateWord(r.state));
        tbody.appendChild(el("tr", { data: { run: r.run_id, state: stateWord(r.state) } },
          el("td", { class: "run" }, el("a", { href: withToken("/run/" + encodeURIComponent(r.run_id)) }, r.run_id)),
          el("td", { class: stateClass(r.state) }, r.state),
          el("td", { class: "job" }, r.job || ""),
          el("td", { class: "inventory" }, r.inventory || r.backend || ""),
          el("td", { class: "hosts" }, (r.hosts || []).join(", ")),
          el("td", { class: "attempts num" }, r.attempts === null || r.attempts === undefined ? "" : String(r.attempts)),
          el("td", { class: "started" }, when(r.started)),
          el("td", { class: "duration num" }, span(r.duration)),
          el("td", { class: "user" }, r.user || "")));
      }
      for (const s of [...states].sort()) stateSel.appendChild(el("option", { value: s }, s));
      if (!(data.runs || []).length) tbody.appendChild(el("tr", {}, el("td", { colspan: 9, class: "muted" }, "no run recorded here yet")));
      const damaged = Object.keys(data.damaged || {}).length;
      older = (data.more ? ` (${data.more} older not listed: fleet ps --all)` : "") +
        (damaged ? `; ${damaged} damaged record(s) skipped: ` + Object.entries(data.damaged).map(([p, why]) => `${p} (${why})`).join("; ") : "");
      apply();
    }).catch(() => {});
    filter.addEventListener("input", apply);
    stateSel.addEventListener("change", apply);
  }

  // ---- a Run -------------------------------------------------------------------------------------
  // Python's pattern as JavaScript writes it: (?P<v>...) -> (?<v>...), (?P=v) -> \k<v>, and
  // leading inline flags (?i) / (?m) / (?s) as the RegExp's flags.
  function jsRegex(pattern) {
    let text = String(pattern);
    let flags = "";
    const inline = /^\(\?([aiLmsux]+)\)/.exec(text);
    if (inline) {
      text = text.slice(inline[0].length);
      flags = [...new Set(inline[1].replace(/[aLux]/g, ""))].join("");
    }
    return new RegExp(text.replace(/\(\?P</g, "(?<").replace(/\(\?P=(\w+)\)/g, "\\k<$1>"), flags);
  }

  function kvTable(obj) {
    const tbody = el("tbody");
    for (const [k, v] of Object.entries(obj || {})) {
      let value = String(v === null ? "" : v);
      if (v !== null && typeof v === "object") { // folded: a manifest's env or packages are long
        const n = Object.keys(v).length;
        value = el("details", {}, el("summary", {}, `${n} ${Array.isArray(v) ? "item" : "key"}${n === 1 ? "" : "s"}`),
          el("pre", { class: "value" }, JSON.stringify(v, null, 2)));
      }
      tbody.appendChild(el("tr", {}, el("th", {}, k), el("td", {}, value)));
    }
    return el("table", { class: "kv" }, tbody);
  }

  function run() {
    const ranksOf = new Map(); // host -> Set of global ranks seen (node_started, lines)
    const rankOptions = new Set();
    let info = null;
    let following = true;
    const log = $("log");
    const plots = new Map(); // metric -> {re, chart, byRank: Map(rank -> values)}

    $("run-id").textContent = RUN;
    document.title = `fleet: ${RUN}`;

    // ---- the run's facts (re-read on node_ended / verdict / state)
    function renderRun(r) {
      info = r;
      for (const [host, planned] of Object.entries(r.ranks || {})) {
        for (const rank of planned) seeRank(host, rank);
      }
      const st = r.state || (r.status && r.status.status) || "unknown";
      $("run-state").textContent = st;
      $("run-state").className = stateClass(st);
      $("stop").disabled = ["succeeded", "failed", "stopped"].includes(stateWord(st));
      $("stop").title = $("stop").disabled ? `the run has ${stateWord(st)}: nothing to stop` : "";
      const facts = clear($("run-facts").tBodies[0]);
      const row = (k, v) => facts.appendChild(el("tr", {}, el("th", {}, k), el("td", {}, v)));
      row("job", r.job || "");
      row("hosts", (r.hosts || []).join(", "));
      row("started", when(r.started));
      row("duration", span(r.duration));
      const status = r.status || {};
      if (status.watched_by) row("watched by", status.watched_by.words || status.watched_by.who || "");
      if (status.verdict && status.verdict.said) row("verdict", status.verdict.said);
      renderNodes(status.nodes || [], st);

      const failure = $("failure");
      failure.textContent = (r.failure || []).length ? r.failure.join("\n") : "no failure report";
      failure.classList.toggle("muted", !(r.failure || []).length);

      const hang = clear($("hang"));
      if (r.hang) {
        hang.append(el("p", { class: "verdict" }, r.hang.verdict || "",
          r.hang.file ? el("span", { class: "muted" }, ` (kept as ${r.hang.file})`) : ""),
          el("pre", { class: "report stacks" }, (r.hang.stacks || []).join("\n")));
      } else hang.append(el("p", { class: "muted" }, "no hang seen"));

      const s = clear($("straggler"));
      if (status.straggler) {
        const x = status.straggler;
        s.append(el("p", {}, x.line || `rank ${x.rank} (${x.host}) is the straggler`),
          el("p", { class: "muted" }, `rank ${x.rank} on ${x.host}: ${Number(x.score).toFixed(2)}× the others' compute per step; ` +
            `the others wait ${Math.round(100 * (x.others_wait || 0))}% of their time` + (x.place ? ` in ${x.place}` : "") +
            (x.at ? `; named at ${when(x.at)}` : "")));
      } else s.append(el("p", { class: "muted" }, "no straggler named (the watch runs with [watchdog] straggler)"));

      renderAttempts(status.attempts);
      const m = clear($("manifest"));
      if (r.manifest && typeof r.manifest === "object") m.append(kvTable(r.manifest));
      else m.append(el("p", { class: "muted" }, "no manifest recorded"));
      setupPlots(r.metrics || {});
    }

    function renderNodes(nodes, runState) {
      const tbody = clear($("nodes").tBodies[0]);
      for (const n of nodes) {
        const word = n.status || (stateWord(runState) === "running" ? "running" : "unknown");
        const ranks = [...(ranksOf.get(n.host) || [])].sort((a, b) => a - b);
        tbody.appendChild(el("tr", { data: { host: n.host } },
          el("td", { class: "host" }, n.host),
          el("td", { class: "num" }, n.node_rank === undefined ? "" : String(n.node_rank)),
          el("td", { class: "ranks" }, ranks.join(", ")),
          el("td", { class: stateClass(word) }, word),
          el("td", { class: "num" }, n.exit_code === null || n.exit_code === undefined ? "" : String(n.exit_code)),
          el("td", { class: "num" }, span(n.elapsed)),
          el("td", { class: "detail" }, [n.detail, n.own_failure].filter(Boolean).join("; "))));
      }
      if (!nodes.length) tbody.appendChild(el("tr", {}, el("td", { colspan: 7, class: "muted" }, "no node recorded")));
    }

    function renderAttempts(tried) {
      const box = clear($("attempts"));
      const items = tried && Array.isArray(tried.attempts) ? tried.attempts : [];
      if (!items.length) {
        box.append(el("p", { class: "muted" }, "one attempt (no [restart] in the job)"));
        return;
      }
      const tbody = el("tbody");
      for (const a of items) {
        const replaced = Object.entries(a.replaced || {}).map(([h, s]) => `${h} → ${s}`).join(", ");
        tbody.appendChild(el("tr", { data: { attempt: a.number } },
          el("td", { class: "num" }, `${a.number}/${(tried.max || 0) + 1}`),
          el("td", {}, el("a", { href: withToken("/run/" + encodeURIComponent(a.run_id)) }, a.run_id)),
          el("td", { class: stateClass(a.status) }, a.status),
          el("td", {}, (a.hosts || []).join(", ")),
          el("td", {}, when(a.started)), el("td", {}, when(a.ended)),
          el("td", {}, [a.why, replaced && `replaced ${replaced}`, a.then].filter(Boolean).join("; "))));
      }
      box.append(el("table", { class: "grid" }, el("thead", {}, el("tr", {},
        ...["attempt", "run", "state", "hosts", "started", "ended", "why / then"].map((h) => el("th", {}, h)))), tbody));
    }

    let refetching = null;
    function refetch() {
      if (refetching) return;
      refetching = setTimeout(() => {
        refetching = null;
        getJson("/api/run/" + encodeURIComponent(RUN)).then(renderRun).catch(() => {});
      }, 300);
    }

    // ---- plots: one per metric, a series per rank, the nth value of each rank at x = n
    function setupPlots(metrics) {
      const box = $("plots");
      for (const [name, pattern] of Object.entries(metrics)) {
        if (plots.has(name)) continue;
        const div = el("div", { class: "plot", data: { metric: name } });
        const target = el("div", { class: "chart" });
        div.append(el("h3", {}, name === "step_ms" ? "step time per rank (step_ms)" : name), target);
        box.append(div);
        let re = null;
        try { re = jsRegex(pattern); } catch (e) {
          target.textContent = `its pattern ${pattern} is not one this page can use (${e.message})`;
        }
        plots.set(name, { re, chart: new Chart(target, "sample", name), byRank: new Map(), target });
        if (re) target.textContent = "no value seen yet";
      }
      if (!plots.size && !box.firstChild) {
        box.append(el("p", { class: "muted" }, "the job names no metric ([metrics] NAME = \"regex with (?P<v>...)\")"));
      }
    }

    function measure(ev) {
      // One series a rank; a line no rank claims (a job without torchrun) counts for its host.
      const who = ev.rank === null || ev.rank === undefined ? String(ev.host || "") : `rank ${ev.rank}`;
      if (!who) return;
      for (const p of plots.values()) {
        if (!p.re) continue;
        const m = p.re.exec(ev.text || "");
        const v = m && m.groups && m.groups.v !== undefined ? parseFloat(m.groups.v) : NaN;
        if (!isFinite(v)) continue;
        if (!p.byRank.has(who)) p.byRank.set(who, []);
        p.byRank.get(who).push(v);
        p.chart.show(() => series(p.byRank), false);
      }
    }

    function series(byRank) {
      const ranks = [...byRank.keys()].sort((a, b) => a.localeCompare(b, undefined, { numeric: true }));
      const n = Math.max(...ranks.map((r) => byRank.get(r).length));
      const xs = Array.from({ length: n }, (_, i) => i + 1);
      return {
        names: ranks,
        data: [xs, ...ranks.map((r) => {
          const vals = byRank.get(r);
          return vals.length === n ? vals.slice() : vals.concat(new Array(n - vals.length).fill(null));
        })],
      };
    }

    // ---- the log
    function matches(line) {
      const q = $("log-search").value.trim().toLowerCase();
      const sel = $("log-rank").value;
      if (sel.startsWith("rank:") && line.dataset.rank !== sel.slice(5)) return false;
      if (sel.startsWith("host:") && line.dataset.host !== sel.slice(5)) return false;
      return !q || line.textContent.toLowerCase().includes(q);
    }

    function refilter() {
      for (const line of log.children) line.hidden = !matches(line);
      keepFollowing();
    }

    // The rank select: every host's lines first (by name), then each rank (by number).
    function optionKey(value) {
      return value.startsWith("rank:") ? "1" + value.slice(5).padStart(9, "0") : "0" + value.slice(5);
    }

    function addOption(value, words) {
      if (rankOptions.has(value)) return;
      rankOptions.add(value);
      const sel = $("log-rank");
      const after = [...sel.options].find((o) => o.value && optionKey(o.value) > optionKey(value));
      sel.insertBefore(el("option", { value }, words), after || null);
    }

    function seeRank(host, rank) {
      if (rank === null || rank === undefined) return false;
      if (!ranksOf.has(host)) ranksOf.set(host, new Set());
      const fresh = !ranksOf.get(host).has(rank);
      ranksOf.get(host).add(rank);
      addOption("rank:" + rank, `rank ${rank} (${host})`);
      return fresh;
    }

    function appendLine(tag, text, data, cls) {
      const line = el("div", { class: "line" + (cls ? " " + cls : ""), data },
        el("span", { class: "tag" }, tag), el("span", { class: "text" }, text));
      line.hidden = !matches(line);
      log.appendChild(line);
      while (log.childElementCount > MAX_LINES) log.removeChild(log.firstChild);
      keepFollowing();
    }

    // Following: the log stays at its bottom (once a frame, however many lines came) until the
    // person scrolls up; scrolling back to the bottom follows again.
    let lastAuto = 0;
    let scrollQueued = false;
    function keepFollowing() {
      if (!following || scrollQueued) return;
      scrollQueued = true;
      requestAnimationFrame(() => {
        scrollQueued = false;
        if (!following) return;
        log.scrollTop = log.scrollHeight;
        lastAuto = log.scrollTop;
      });
    }

    function onEvent(ev) {
      if (!ev || typeof ev !== "object") return;
      switch (ev.event) {
        case "line": {
          const host = ev.host || "";
          if (seeRank(host, ev.rank)) refetchNodesSoon();
          if (host) addOption("host:" + host, `${host}: every line`);
          const data = { host };
          if (ev.rank !== null && ev.rank !== undefined) data.rank = String(ev.rank);
          appendLine(ev.tag || host, ev.text || "", data);
          measure(ev);
          break;
        }
        case "node_started":
          for (const r of ev.ranks || []) seeRank(ev.host, r);
          appendLine("fleet", `${ev.host}: started (node rank ${ev.node_rank}${ev.master ? ", the master" : ""})`, { host: ev.host || "" }, "fleet");
          refetch();
          break;
        case "node_ended":
          appendLine("fleet", `${ev.host}: ${ev.status}` + (ev.exit_code !== null && ev.exit_code !== undefined ? ` (exit code ${ev.exit_code})` : "") +
            (ev.detail ? `: ${ev.detail}` : ""), { host: ev.host || "" }, "fleet");
          refetch();
          break;
        case "verdict":
          appendLine("fleet", `verdict: ${ev.status}` + (ev.words ? `: ${ev.words}` : ""), {}, "fleet");
          refetch();
          break;
        case "phase": // `following` is this page's own reading of the log: no news
          $("run-phase").textContent = ev.step && ev.step !== "following"
            ? `(${ev.step}${ev.host ? " " + ev.host : ""})` : "";
          break;
        case "note":
          appendLine("fleet", ev.words || "", { host: ev.host || "" }, "fleet tone-" + String(ev.tone || "plain").replace(/\W/g, ""));
          break;
        case "error":
          appendLine("fleet", `error: ${ev.words || ""}`, {}, "fleet tone-fail");
          break;
        case "straggler":
          appendLine("fleet", `straggler: ${ev.line || ""}`, { host: ev.host || "" }, "fleet tone-warn");
          refetch();
          break;
        case "attempt":
          appendLine("fleet", `attempt ${ev.number} of ${ev.of} in ${span(ev.wait)}: ${ev.why || ""}`, {}, "fleet tone-warn");
          refetch();
          break;
        case "quiet":
          appendLine("fleet", `no node has printed for ${span(ev.silent)}`, {}, "fleet tone-warn");
          break;
        default:
          break; // an event this page does not know: readers ignore what they do not know
      }
    }

    let nodesTimer = null;
    function refetchNodesSoon() { // a new rank: the nodes table shows it (no new fetch needed)
      if (nodesTimer || !info) return;
      nodesTimer = setTimeout(() => {
        nodesTimer = null;
        renderNodes((info.status && info.status.nodes) || [], $("run-state").textContent);
      }, 500);
    }

    function showFollowing() {
      const b = $("log-follow");
      b.textContent = following ? "following" : "paused: follow ↓";
      b.classList.toggle("paused", !following);
    }
    log.addEventListener("scroll", () => {
      if (log.scrollTop + log.clientHeight >= log.scrollHeight - 24) {
        following = true;
        lastAuto = log.scrollTop;
      } else if (log.scrollTop < lastAuto - 4) {
        following = false;
      }
      showFollowing();
    });
    $("log-follow").addEventListener("click", () => {
      following = true;
      showFollowing();
      keepFollowing();
    });
    showFollowing();
    let searchTimer = null;
    $("log-search").addEventListener("input", () => { // a long log: once typing pauses
      clearTimeout(searchTimer);
      searchTimer = setTimeout(refilter, 150);
    });
    $("log-rank").addEventListener("change", refilter);

    // ---- actions
    $("stop").addEventListener("click", async () => {
      if (!confirm(`Stop run ${RUN}? Every node's part of it is stopped.`)) return;
      $("stop").disabled = true;
      $("stop").textContent = "Stopping…";
      try {
        await post("/api/run/" + encodeURIComponent(RUN) + "/stop", {});
      } finally {
        $("stop").disabled = false;
        $("stop").textContent = "Stop";
        refetch();
      }
    });
    $("pull").addEventListener("click", async () => {
      const all = $("pull-all").checked;
      if (!confirm(`Pull the outputs of run ${RUN}${all ? " from every node" : ""} into ./${RUN}/ where fleet ui runs?`)) return;
      $("pull").disabled = true;
      $("pull").textContent = "Pulling…";
      try {
        await post("/api/run/" + encodeURIComponent(RUN) + "/pull", { all });
      } finally {
        $("pull").disabled = false;
        $("pull").textContent = "Pull outputs";
      }
    });
    async function diff() {
      const other = $("diff-with").value.trim();
      if (!other) return;
      $("diff").textContent = "…";
      try {
        const d = await getJson(`/api/run/${encodeURIComponent(RUN)}/diff?other=${encodeURIComponent(other)}`);
        $("diff").textContent = (d.lines || []).length ? d.lines.join("\n") : `no difference between ${d.a} and ${d.b}`;
      } catch (e) {
        $("diff").textContent = ""; // the banner says why
      }
    }
    $("diff-go").addEventListener("click", diff);
    $("diff-with").addEventListener("keydown", (e) => { if (e.key === "Enter") diff(); });

    getJson("/api/run/" + encodeURIComponent(RUN)).then(renderRun).catch(() => {});
    stream("/api/run/" + encodeURIComponent(RUN) + "/stream", {
      fleet: onEvent,
      state: (d) => {
        if (d && d.state) {
          $("run-state").textContent = d.state;
          $("run-state").className = stateClass(d.state);
        }
        refetch();
      },
      end: (d, es) => {
        es.close();
        const words = d && d.words ? String(d.words).trim() : "";
        if (d && d.exit_code && words) appendLine("fleet", words, {}, "fleet tone-fail");
        $("run-phase").textContent = "";
        $("live").textContent = "the log has ended";
        $("live").className = "live off";
        refetch();
      },
      reopened: () => { // the server replays the log from its start: start over
        clear(log);
        for (const p of plots.values()) p.byRank.clear();
      },
    });
  }

  // ---- start -------------------------------------------------------------------------------------
  nav();
  const page = { lab, runs, run }[PAGE] ? PAGE : "lab";
  $("page-" + page).hidden = false;
  ({ lab, runs, run })[page]();
})();

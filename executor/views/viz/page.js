// The voyage page: the plan (and, on a live page, the run) drawn as a DAG laid out by dagre.
// Everything comes from the JSON blocks in this file; all text is set with textContent, never
// parsed as HTML, so any string in a config shows as text. No network, except that a live page
// served over http(s) re-reads voyage.json next to it.
(function () {
  "use strict";
  const D = JSON.parse(document.getElementById("voyage-data").textContent);
  const runBlock = document.getElementById("voyage-run");
  let R = runBlock ? JSON.parse(runBlock.textContent) : null;
  const steps = D.steps, boxes = D.boxes, links = D.links, N = steps.length;
  const STATES = D.states;  // most urgent first
  const SVGNS = "http://www.w3.org/2000/svg";
  const $ = (id) => document.getElementById(id);
  const svg = $("dag"), viewport = $("viewport");

  const consumers = steps.map(() => []);
  steps.forEach((s, i) => s.deps.forEach((d) => consumers[d].push(i)));
  const index = new Map(steps.map((s, i) => [s.name, i]));

  function svgEl(tag, attrs, text) {
    const e = document.createElementNS(SVGNS, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function h(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  const clamp = (x, lo, hi) => Math.max(lo, Math.min(hi, x));
  const order = (s) => { const i = STATES.indexOf(s); return i < 0 ? STATES.length : i; };

  // -- state of a step: the run's when there is one, else the plan's ---------------------------
  function stateOf(i) { return R && R.steps && R.steps[i] ? R.steps[i][0] : steps[i].state; }
  function seconds(x) {
    if (x === null || x === undefined) return "";
    if (x < 60) return x.toFixed(x < 10 ? 1 : 0) + "s";
    if (x < 3600) return Math.floor(x / 60) + "m" + String(Math.round(x % 60)).padStart(2, "0") + "s";
    if (x < 86400) return Math.floor(x / 3600) + "h" + String(Math.round((x % 3600) / 60)).padStart(2, "0") + "m";
    return Math.floor(x / 86400) + "d" + Math.round((x % 86400) / 3600) + "h";
  }
  function runInfo(i) {  // [state, attempts, started, ended, note] -> words
    const r = R && R.steps && R.steps[i];
    if (!r || !r[2]) return "";
    const end = r[3] || (R.finished || R.updated);
    let text = seconds(Math.max(0, end - r[2]));
    if (r[1] > 1) text += " · attempt " + r[1];
    return text;
  }
  function when(t) { return t ? new Date(t * 1000).toLocaleString() : ""; }
  function failedOf(i) {  // the failed attempts of step i in this run: [[attempt, class, error], ...]
    return (R && R.failed_attempts ? R.failed_attempts : []).filter((f) => f[0] === i).map((f) => f.slice(1));
  }
  function failedText(i) {  // "hang ×2, non_finite": the classes of its failed attempts
    const byClass = {};
    failedOf(i).forEach(([, cls]) => { byClass[cls] = (byClass[cls] || 0) + 1; });
    return Object.keys(byClass).map((c) => c + (byClass[c] > 1 ? " ×" + byClass[c] : "")).join(", ");
  }
  function failedList() {  // the run's failed attempts, each with its class, linked to its step
    const el = $("failed"), all = (R && R.failed_attempts) || [];
    el.hidden = !all.length;
    el.textContent = "";
    if (!all.length) return;
    el.appendChild(h("h2", "", "failed attempts " + all.length));
    const ul = h("ul", "steplist");
    all.forEach(([i, attempt, cls, why]) => {
      const li = h("li", "failed-attempt");
      li.dataset.step = i;
      const name = h("button", "link", steps[i].name);
      name.addEventListener("click", () => select(i, true));
      li.appendChild(name);
      li.appendChild(h("span", "", " attempt " + attempt + " "));
      li.appendChild(h("span", "cls", cls));
      li.appendChild(h("span", "", " " + why));
      ul.appendChild(li);
    });
    el.appendChild(ul);
  }
  function counts(members) {
    const c = {};
    for (const i of members) { const s = stateOf(i); c[s] = (c[s] || 0) + 1; }
    return c;
  }
  function countsText(c) {
    return Object.keys(c).sort((a, b) => order(a) - order(b)).map((s) => s + " " + c[s].toLocaleString()).join(" · ");
  }

  // -- sizes ---------------------------------------------------------------------------------------
  const CH = 7.3, CELL_H = 18, GAP = 3, BOX_H = 40, MAX_NAME = 60;
  const clip = (t, n) => (t.length > n ? t.slice(0, n - 1) + "…" : t);
  function single(i) {
    const s = steps[i];
    const sub = s.type + " · " + s.state;
    return { w: clamp(Math.ceil(CH * Math.max(clip(s.name, MAX_NAME).length, sub.length + 14)) + 20, 120, 480), h: BOX_H };
  }
  function group(label, members) {
    const cut = label.length - 1;
    const suffixes = members.map((i) => steps[i].name.slice(cut) || steps[i].name);
    const longest = suffixes.reduce((m, s) => Math.max(m, s.length), 1);
    const cw = clamp(Math.ceil(CH * Math.min(longest, 20)) + 10, 22, 160);
    const head = Math.ceil(CH * (label.length + 14)) + 16;
    let cols = Math.max(1, Math.round(Math.sqrt((members.length * (CELL_H + GAP)) / ((cw + GAP) * 2.5))));
    const w = Math.max(cols * (cw + GAP) + GAP + 16, Math.min(head, 520));
    cols = Math.max(1, Math.floor((w - 16 - GAP) / (cw + GAP)));
    const rows = Math.ceil(members.length / cols);
    return { w: w, h: 44 + rows * (CELL_H + GAP) + 8, cw: cw, cols: cols, suffixes: suffixes };
  }

  // -- layout (dagre) and drawing -------------------------------------------------------------------
  const stepEl = new Array(N), subEl = new Array(N), centre = new Array(N);
  const groupSub = [];
  let width = 0, height = 0;

  function layoutAs(rankdir, sizes) {
    const g = new dagre.graphlib.Graph();
    g.setGraph({ rankdir: rankdir, nodesep: 16, ranksep: rankdir === "LR" ? 80 : 48, edgesep: 10, marginx: 30, marginy: 30 });
    g.setDefaultEdgeLabel(() => ({}));
    sizes.forEach((sz, b) => g.setNode(String(b), { width: sz.w, height: sz.h }));
    for (const [a, b] of links) g.setEdge(String(a), String(b));
    dagre.layout(g);
    return g;
  }
  // Left to right, unless top to bottom fills the panel at a larger scale (a long chain in a tall
  // window): the graph fits its panel with labels that can be read. Plans of thousands of boxes
  // are laid out once.
  function layout() {
    const sizes = boxes.map(([label, members]) => (members.length > 1 ? group(label, members) : single(members[0])));
    const r = svg.getBoundingClientRect();
    const scale = (g) => Math.min(r.width / (g.graph().width || 1), r.height / (g.graph().height || 1));
    let g = layoutAs("LR", sizes);
    if (boxes.length <= 3000 && r.width > 0 && r.height > 0) {
      const tb = layoutAs("TB", sizes);
      if (scale(tb) > scale(g) * 1.15) g = tb;
    }
    return { g: g, sizes: sizes };
  }

  function draw(lay) {
    const gBoxes = $("boxes"), gLinks = $("links");
    const { g, sizes } = lay;
    width = g.graph().width || 100; height = g.graph().height || 100;
    for (const [a, b, n, stale] of links) {
      const e = g.edge(String(a), String(b));
      if (!e || !e.points) continue;
      const p = e.points;
      let d = "M" + p[0].x.toFixed(1) + "," + p[0].y.toFixed(1);
      for (let k = 1; k < p.length; k++) d += "L" + p[k].x.toFixed(1) + "," + p[k].y.toFixed(1);
      const path = svgEl("path", { d: d, class: "link" + (stale ? " stale" : ""), "marker-end": stale ? "url(#arrow-stale)" : "url(#arrow)" });
      if (n > 1) path.style.strokeWidth = clamp(1 + Math.log2(n) / 2, 1, 6).toFixed(1);
      const tip = svgEl("title", {}, (n > 1 ? n.toLocaleString() + " edges" : "1 edge") + (stale ? " (" + stale + " from an input whose output changed)" : ""));
      path.appendChild(tip);
      gLinks.appendChild(path);
      if (n > 1 || stale) {
        const m = p[Math.floor(p.length / 2)];
        gLinks.appendChild(svgEl("text", { x: m.x + 4, y: m.y - 4, class: "linklabel" + (stale ? " stale" : "") },
          (n > 1 ? "×" + n.toLocaleString() : "") + (stale ? " output changed" : "")));
      }
    }
    boxes.forEach(([label, members], b) => {
      const node = g.node(String(b)), sz = sizes[b];
      const x0 = node.x - sz.w / 2, y0 = node.y - sz.h / 2;
      if (members.length === 1) {
        const i = members[0], s = steps[i];
        const el = svgEl("g", { class: "box step s-" + s.state, "data-step": i, transform: "translate(" + x0 + "," + y0 + ")" });
        el.appendChild(svgEl("rect", { width: sz.w, height: sz.h, rx: 6 }));
        el.appendChild(svgEl("text", { x: 10, y: 16, class: "name" }, clip(s.name, MAX_NAME)));
        const sub = svgEl("text", { x: 10, y: 31, class: "sub" }, "");
        el.appendChild(sub);
        el.appendChild(svgEl("title", {}, s.name));
        gBoxes.appendChild(el);
        stepEl[i] = el; subEl[i] = sub;
        centre[i] = [node.x, node.y, sz.w / 2];
        return;
      }
      const el = svgEl("g", { class: "box group", transform: "translate(" + x0 + "," + y0 + ")", "data-group": b });
      el.appendChild(svgEl("rect", { class: "frame", width: sz.w, height: sz.h, rx: 8 }));
      el.appendChild(svgEl("text", { x: 8, y: 17, class: "gname" }, label + "  (" + members.length.toLocaleString() + ")"));
      const gsub = svgEl("text", { x: 8, y: 33, class: "gsub" }, "");
      el.appendChild(gsub);
      groupSub[b] = gsub;
      const cells = svgEl("g", {}), labels = svgEl("g", { class: "clabels" });
      members.forEach((i, k) => {
        const cx = 8 + GAP + (k % sz.cols) * (sz.cw + GAP), cy = 44 + Math.floor(k / sz.cols) * (CELL_H + GAP);
        const cell = svgEl("rect", { class: "cell step s-" + steps[i].state, "data-step": i, x: cx, y: cy, width: sz.cw, height: CELL_H, rx: 3 });
        cell.appendChild(svgEl("title", {}, steps[i].name));
        cells.appendChild(cell);
        labels.appendChild(svgEl("text", { x: cx + 4, y: cy + 13, class: "clabel" }, clip(sz.suffixes[k], 20)));
        stepEl[i] = cell;
        centre[i] = [x0 + cx + sz.cw / 2, y0 + cy + CELL_H / 2, sz.cw / 2];
      });
      el.appendChild(cells); el.appendChild(labels);
      gBoxes.appendChild(el);
    });
  }

  // -- state colours, texts, legend, summary (re-run on every live update) ---------------------------
  function paint() {
    for (let i = 0; i < N; i++) {
      const el = stepEl[i];
      if (!el) continue;
      const s = stateOf(i), base = el.tagName === "g" ? "box step" : "cell step";
      const keep = ["sel", "nbr", "up", "down", "match"].filter((c) => el.classList.contains(c));
      el.setAttribute("class", base + " s-" + s + (keep.length ? " " + keep.join(" ") : ""));
      if (subEl[i]) {
        const run = runInfo(i), failed = failedText(i);
        subEl[i].textContent = steps[i].type + " · " + s + (run ? " · " + run : "") + (failed ? " · failed: " + failed : "");
      }
    }
    boxes.forEach(([, members], b) => { if (groupSub[b]) groupSub[b].textContent = countsText(counts(members)); });
    const all = counts(steps.map((_, i) => i));
    const legend = $("legend");
    legend.textContent = "";
    Object.keys(all).sort((a, b) => order(a) - order(b)).forEach((s) => {
      const chip = h("button", "chip s-" + s, s + " " + all[s].toLocaleString());
      chip.title = (D.descriptions[s] || "") + " (click to show only these)";
      chip.dataset.state = s;
      if (svg.dataset.only === s) chip.classList.add("on");
      legend.appendChild(chip);
    });
    let text = N.toLocaleString() + " steps under " + D.prefix + " · planned " + when(D.planned_at);
    if (R) {
      text = N.toLocaleString() + " steps under " + D.prefix + " · run started " + when(R.started) +
        (R.finished ? " · finished " + when(R.finished) + " (" + seconds(R.finished - R.started) + ")"
          : " · running · updated " + when(R.updated));
    }
    $("summary").textContent = text;
    drawLadder();
    failedList();
    drawCurves();
    if (selected !== null) showDetails(selected);
  }

  // -- pan and zoom ----------------------------------------------------------------------------------
  const T = { x: 0, y: 0, k: 1 };
  function apply() {
    viewport.setAttribute("transform", "translate(" + T.x.toFixed(1) + "," + T.y.toFixed(1) + ") scale(" + T.k.toFixed(4) + ")");
    svg.classList.toggle("lod1", T.k < 0.6);
    svg.classList.toggle("lod2", T.k < 0.3);
    svg.style.setProperty("--k", T.k.toFixed(4));
  }
  function zoomAt(px, py, f) {
    const k = clamp(T.k * f, 0.01, 6);
    T.x = px - ((px - T.x) * k) / T.k; T.y = py - ((py - T.y) * k) / T.k; T.k = k;
    apply();
  }
  function fit() {
    const r = svg.getBoundingClientRect();
    const k = Math.min(r.width / width, r.height / height, 1.5) * 0.96;
    T.k = k; T.x = (r.width - width * k) / 2; T.y = (r.height - height * k) / 2;
    apply();
  }
  function centreOn(i) {
    const r = svg.getBoundingClientRect(), c = centre[i];
    if (!c) return;
    T.k = Math.max(T.k, 1);
    T.x = r.width / 2 - c[0] * T.k; T.y = r.height / 2 - c[1] * T.k;
    apply();
  }
  function keepInView(i) {  // the details pane narrows the canvas: keep the chosen step on screen
    const r = svg.getBoundingClientRect(), c = centre[i];
    const x = c[0] * T.k + T.x;
    if (x > r.width - 30) { T.x -= x - r.width * 0.6; apply(); }
  }
  let drag = null;
  svg.addEventListener("wheel", (e) => { e.preventDefault(); zoomAt(e.offsetX, e.offsetY, Math.exp(-e.deltaY * 0.0015)); }, { passive: false });
  svg.addEventListener("pointerdown", (e) => {
    drag = { x: e.clientX, y: e.clientY, tx: T.x, ty: T.y, target: e.target, moved: false };
    try { svg.setPointerCapture(e.pointerId); } catch (err) { /* synthetic events have no pointer */ }
  });
  svg.addEventListener("pointermove", (e) => {
    if (!drag) return;
    const dx = e.clientX - drag.x, dy = e.clientY - drag.y;
    if (Math.abs(dx) + Math.abs(dy) > 4) drag.moved = true;
    if (drag.moved) { T.x = drag.tx + dx; T.y = drag.ty + dy; apply(); svg.classList.add("dragging"); }
  });
  svg.addEventListener("pointerup", () => {
    svg.classList.remove("dragging");
    if (drag && !drag.moved) {
      const hit = drag.target.closest && drag.target.closest("[data-step]");
      if (hit) select(+hit.dataset.step, false); else select(null);
    }
    drag = null;
  });
  $("fit").addEventListener("click", fit);
  $("zoomin").addEventListener("click", () => { const r = svg.getBoundingClientRect(); zoomAt(r.width / 2, r.height / 2, 1.4); });
  $("zoomout").addEventListener("click", () => { const r = svg.getBoundingClientRect(); zoomAt(r.width / 2, r.height / 2, 1 / 1.4); });
  $("legend").addEventListener("click", (e) => {
    const chip = e.target.closest("[data-state]");
    if (!chip) return;
    if (svg.dataset.only === chip.dataset.state) delete svg.dataset.only; else svg.dataset.only = chip.dataset.state;
    paint();
  });

  // -- selection and details -------------------------------------------------------------------------
  let selected = null, marked = [];
  const LINEAGE_MAX = 20000;  // steps marked in each direction, at most
  function closure(i, edges) {  // every step reached from i along edges (i left out), breadth first
    const seen = new Set([i]), queue = [i];
    for (let q = 0; q < queue.length && seen.size <= LINEAGE_MAX; q++) {
      for (const k of edges(queue[q])) if (!seen.has(k)) { seen.add(k); queue.push(k); }
    }
    seen.delete(i);
    return Array.from(seen);
  }
  let lineage = { up: [], down: [] };
  function select(i, centreIt) {
    for (const j of marked) if (stepEl[j]) stepEl[j].classList.remove("sel", "nbr", "up", "down");
    marked = [];
    const focus = $("focus");
    focus.textContent = "";
    selected = i;
    if (i === null) { $("details").hidden = true; history.replaceState(null, "", location.pathname + location.search); return; }
    const near = steps[i].deps.concat(consumers[i]);
    // Both directions of its lineage: what it was built from, and what was built from it.
    lineage = { up: closure(i, (j) => steps[j].deps), down: closure(i, (j) => consumers[j]) };
    lineage.up.forEach((j) => { stepEl[j].classList.add("up"); marked.push(j); });
    lineage.down.forEach((j) => { stepEl[j].classList.add("down"); marked.push(j); });
    stepEl[i].classList.add("sel");
    marked.push(i);
    near.slice(0, 2000).forEach((j) => { stepEl[j].classList.add("nbr"); marked.push(j); });
    const a = centre[i];
    near.slice(0, 500).forEach((j) => {
      const b = centre[j];
      focus.appendChild(svgEl("line", { x1: a[0], y1: a[1], x2: b[0], y2: b[1] }));
    });
    showDetails(i);
    history.replaceState(null, "", "#" + encodeURIComponent(steps[i].name));
    if (centreIt) centreOn(i); else keepInView(i);
  }

  function row(dl, key, value, cls) {
    if (value === undefined || value === null || value === "") return;
    dl.appendChild(h("dt", "", key));
    dl.appendChild(h("dd", cls || "", value));
  }
  function stepList(title, list) {
    const box = h("div", "");
    if (!list.length) return box;
    box.appendChild(h("h3", "", title + " (" + list.length.toLocaleString() + ")"));
    const ul = h("ul", "steplist");
    list.slice(0, 60).forEach((j) => {
      const li = h("li", "");
      const b = h("button", "chip s-" + stateOf(j), stateOf(j));
      b.dataset.goto = j;
      li.appendChild(b);
      const name = h("button", "link", steps[j].name);
      name.dataset.goto = j;
      li.appendChild(name);
      ul.appendChild(li);
    });
    if (list.length > 60) ul.appendChild(h("li", "muted", "… and " + (list.length - 60).toLocaleString() + " more"));
    box.appendChild(ul);
    return box;
  }
  function showDetails(i) {
    const s = steps[i], st = stateOf(i), pane = $("details");
    pane.hidden = false;
    pane.textContent = "";
    const close = h("button", "close", "×");
    close.title = "close";
    close.addEventListener("click", () => select(null));
    pane.appendChild(close);
    pane.appendChild(h("h2", "", s.name));
    const chip = h("span", "chip s-" + st, st);
    pane.appendChild(chip);
    if (st !== s.state) pane.appendChild(h("span", "muted", "  planned " + s.state));
    const why = R && R.steps && R.steps[i] && R.steps[i][4] && st !== s.state ? R.steps[i][4] : s.reason;
    if (why) pane.appendChild(h("p", "reason", why));
    const dl = h("dl", "");
    if (R && R.steps && R.steps[i]) {
      const r = R.steps[i];
      row(dl, "attempts", r[1] ? String(r[1]) : "");
      row(dl, "started", when(r[2]));
      row(dl, "duration", runInfo(i));
      const failed = failedOf(i);
      if (failed.length) row(dl, "failed attempts", failed.map(([a, cls, why]) => a + ": " + cls + (why ? " (" + why + ")" : "")).join("; "));
    }
    row(dl, "type", s.type);
    row(dl, "digest", s.digest, "mono");
    row(dl, "path", s.path, "mono");
    row(dl, "resources", s.resources);
    row(dl, "held by", s.holder);
    if (s.code_drift) row(dl, "code", "drifted since the output was made");
    if (s.env_drift) row(dl, "made with", s.env_drift);
    if (s.output_problem) row(dl, "output check", s.output_problem);
    if (s.source) row(dl, "source licence", s.source.id + (s.source.url ? " <" + s.source.url + ">" : ""));
    if (s.licenses) row(dl, "licences", s.licenses.length ? s.licenses.join(", ") : "none declared upstream");
    if (s.policy) row(dl, "policy", s.policy);
    row(dl, "lineage", lineage.up.length.toLocaleString() + " upstream (blue), " + lineage.down.length.toLocaleString() + " downstream (green)");
    if (s.conditional_on) row(dl, "runs if", "the outputs of " + s.conditional_on.join(", ") + " change");
    pane.appendChild(dl);
    if (s.stale) {
      pane.appendChild(h("h3", "stale", "changed inputs (why it is STALE)"));
      const t = h("table", "stale");
      const head = h("tr", "");
      ["input", "made from output", "output now"].forEach((x) => head.appendChild(h("th", "", x)));
      t.appendChild(head);
      s.stale.forEach((c) => {
        const tr = h("tr", "");
        tr.appendChild(h("td", "", c.input));
        const was = h("td", "mono", c.recorded.slice(0, 16)); was.title = c.recorded; tr.appendChild(was);
        const now = h("td", "mono", c.current.slice(0, 16)); now.title = c.current; tr.appendChild(now);
        t.appendChild(tr);
      });
      pane.appendChild(t);
    }
    const m = R && R.metrics && R.metrics[i];
    if (m) { pane.appendChild(h("h3", "", "training curves")); pane.appendChild(chartsOf(m)); }
    pane.appendChild(stepList("inputs", s.deps));
    pane.appendChild(stepList("used by", consumers[i]));
    pane.appendChild(h("h3", "", "config"));
    pane.appendChild(h("pre", "config", JSON.stringify(s.config, null, 2)));
    const rec = (R && R.records && R.records[i]) || s.record;
    pane.appendChild(h("h3", "", "record"));
    pane.appendChild(h("pre", "record", rec ? JSON.stringify(rec, null, 2)
      : "no record: this output has not been made under this prefix yet"));
  }
  $("details").addEventListener("click", (e) => {
    const b = e.target.closest("[data-goto]");
    if (b) select(+b.dataset.goto, true);
  });

  // -- search ---------------------------------------------------------------------------------------
  let matches = [], cursor = -1;
  $("search").addEventListener("input", () => {
    for (const j of matches) stepEl[j].classList.remove("match");
    const q = $("search").value.trim().toLowerCase();
    matches = q ? steps.map((s, i) => i).filter((i) => steps[i].name.toLowerCase().includes(q)) : [];
    matches.forEach((j) => stepEl[j].classList.add("match"));
    cursor = -1;
    $("found").textContent = q ? matches.length.toLocaleString() + " found" : "";
  });
  $("search").addEventListener("keydown", (e) => {
    if (e.key !== "Enter" || !matches.length) return;
    cursor = (cursor + 1) % matches.length;
    select(matches[cursor], true);
  });

  // -- training curves (inline SVG) -------------------------------------------------------------------
  const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2"];
  const PREFERRED = ["loss", "grad_norm", "lr", "load_max_mean", "router_entropy", "bias_spread", "dropped_share", "moe_dropped_share", "dropped", "tokens_per_s", "expert_load"];
  function fmt(v) {
    const a = Math.abs(v);
    if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(2);
    return (+v.toPrecision(4)).toLocaleString();
  }
  function chartsOf(m) {
    const byChart = {};
    Object.keys(m.series).forEach((key) => {
      const name = key.replace(/_(min|max|mean|avg|p\d+)$/, "");
      (byChart[name] = byChart[name] || []).push(key);
    });
    const names = Object.keys(byChart).sort((a, b) => {
      const ia = PREFERRED.indexOf(a), ib = PREFERRED.indexOf(b);
      return (ia < 0 ? 99 : ia) - (ib < 0 ? 99 : ib) || a.localeCompare(b);
    });
    const wrap = h("div", "charts");
    if (m.drops) wrap.appendChild(h("div", "drops", dropsLine(m.drops)));
    names.forEach((name) => wrap.appendChild(chart(name, byChart[name].sort(), m)));
    return wrap;
  }
  // Token-expert assignments dropped past a capacity: the run's largest share of a logged row,
  // the worst layer's (which layer, at which step) and the last row's.
  function dropsLine(d) {
    const p = (v) => (100 * v).toPrecision(3) + "%";
    const parts = ["MoE drops:"];
    if (d.share_max !== undefined) parts.push("run max " + p(d.share_max) + " of the assignments", "last " + p(d.last));
    if (d.layer_max !== undefined) parts.push("worst layer " + d.layer + " at " + p(d.layer_max) + " (step " + fmt(d.layer_step) + ")");
    return parts.join(" · ").replace(": · ", ": ");
  }
  function short(v) {  // 1.2M, 3.4B: token counts on an axis
    const a = Math.abs(v);
    for (const [d, u] of [[1e12, "T"], [1e9, "B"], [1e6, "M"], [1e3, "k"]]) if (a >= d) return (+(v / d).toPrecision(3)) + u;
    return fmt(v);
  }
  function axes(el, x0, x1, y0, y1, box, xfmt, xname) {
    const [L, T, W, H] = box, n = 4;
    el.appendChild(svgEl("rect", { x: L, y: T, width: W, height: H, class: "plot" }));
    for (let i = 0; i <= n; i++) {
      const y = T + (H * i) / n, v = y1 - ((y1 - y0) * i) / n;
      el.appendChild(svgEl("line", { x1: L, x2: L + W, y1: y, y2: y, class: "grid" }));
      el.appendChild(svgEl("text", { x: L - 4, y: y + 3, class: "tick", "text-anchor": "end" }, fmt(v)));
      const x = L + (W * i) / n, u = x0 + ((x1 - x0) * i) / n;
      el.appendChild(svgEl("text", { x: x, y: T + H + 13, class: "tick", "text-anchor": i === 0 ? "start" : i === n ? "end" : "middle" },
        xfmt(u) + (i === n && xname ? " " + xname : "")));
    }
  }
  function bounds(lists) {
    let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
    lists.forEach((pts) => pts.forEach(([x, y]) => {
      x0 = Math.min(x0, x); x1 = Math.max(x1, x); y0 = Math.min(y0, y); y1 = Math.max(y1, y);
    }));
    if (!isFinite(x0)) { x0 = 0; x1 = 1; y0 = 0; y1 = 1; }
    if (x1 === x0) x1 = x0 + 1;
    if (y1 === y0) { y1 = y0 + Math.abs(y0 || 1) * 0.05; y0 = y0 - Math.abs(y0 || 1) * 0.05; }
    return [x0, x1, y0, y1];
  }
  function chartWidth() {
    const pane = $("curves"), w = (pane && pane.clientWidth) || 1200;
    return clamp(Math.floor((w - 40) / 3) - 8, 260, 520);
  }
  function chart(name, keys, m) {
    const W = chartWidth(), H = 170, L = 58, Rm = 12, Tm = Math.max(22, 8 + 11 * keys.length), B = 20;
    const el = svgEl("svg", { class: "chart", width: W, height: H, viewBox: "0 0 " + W + " " + H });
    const [x0, x1, y0, y1] = bounds(keys.map((k) => m.series[k]));
    const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - Rm), sy = (y) => Tm + (1 - (y - y0) / (y1 - y0)) * (H - Tm - B);
    axes(el, x0, x1, y0, y1, [L, Tm, W - L - Rm, H - Tm - B], fmt, m.x || "");
    shade(el, (m.rewound || []).map((r) => [r[0], r[1], "steps " + r[0] + "–" + r[1]]), sx, x0, x1, Tm, H - B);
    el.appendChild(svgEl("text", { x: 4, y: 14, class: "ctitle" }, name));
    keys.forEach((k, n) => {
      const pts = m.series[k].map(([x, y]) => sx(x).toFixed(1) + "," + sy(y).toFixed(1)).join(" ");
      el.appendChild(svgEl("polyline", { points: pts, class: "series", stroke: PALETTE[n % PALETTE.length] }));
      const last = m.series[k][m.series[k].length - 1];
      const label = (keys.length > 1 ? k.slice(name.length + 1) + " " : "") + (last ? fmt(last[1]) : "");
      el.appendChild(svgEl("text", { x: W - Rm - 2, y: 14 + 11 * n, class: "tick value", "text-anchor": "end", fill: PALETTE[n % PALETTE.length] }, label));
    });
    if (name === "loss" && m.events) marks(el, m.events.map((e) => [e.step, e.kind]), sx, Tm, H - B);
    return el;
  }
  function shade(el, spans, sx, x0, x1, top, bottom) {  // rewound stretches: their data was thrown away
    spans.forEach(([a, b, what]) => {
      const lo = Math.max(Math.min(a, b), x0), hi = Math.min(Math.max(a, b), x1);
      if (!(hi >= lo)) return;
      const r = svgEl("rect", { class: "rewound", x: sx(lo), y: top, width: Math.max(1.5, sx(hi) - sx(lo)), height: bottom - top });
      r.appendChild(svgEl("title", {}, "rewound: " + what + " trained on, then thrown away (back to the checkpoint)"));
      el.appendChild(r);
    });
  }
  function segments(pts) {  // a curve cut where x runs back (the loss by tokens after a rewind)
    const out = [];
    pts.forEach((p, n) => { if (!n || p[0] < pts[n - 1][0]) out.push([]); out[out.length - 1].push(p); });
    return out;
  }
  function marks(el, evs, sx, top, bottom) {  // spike skips and rewinds: a line each, titled
    evs.forEach(([x, kind]) => {
      const line = svgEl("line", { x1: sx(x), x2: sx(x), y1: top, y2: bottom, class: "event " + kind });
      line.appendChild(svgEl("title", {}, kind + " at step " + x));
      el.appendChild(line);
    });
  }
  // The loss by tokens, every training step of the voyage on one axis (pretrain into midtrain),
  // with the reference curve and the spike events.
  function overview(keys) {
    const pane = $("curves"), W = Math.max(600, ((pane && pane.clientWidth) || 1200) - 40), H = 280;
    const L = 64, Rm = 16, Tm = 26, B = 22;
    const parts = keys.map((k) => ({ i: +k, m: R.metrics[k], pts: R.metrics[k].by_tokens }))
      .sort((a, b) => a.pts[0][0] - b.pts[0][0]);
    const ref = (parts.find((p) => p.m.reference) || {}).m;
    const lists = parts.map((p) => p.pts).concat(ref ? [ref.reference] : []);
    const [x0, x1, y0, y1] = bounds(lists);
    const el = svgEl("svg", { class: "chart overview", width: W, height: H, viewBox: "0 0 " + W + " " + H });
    const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - Rm), sy = (y) => Tm + (1 - (y - y0) / (y1 - y0)) * (H - Tm - B);
    axes(el, x0, x1, y0, y1, [L, Tm, W - L - Rm, H - Tm - B], short, "tokens");
    el.appendChild(svgEl("text", { x: 4, y: 16, class: "ctitle" }, "loss by tokens, every training step"));
    const poly = (pts, cls, color) => el.appendChild(svgEl("polyline", {
      points: pts.map(([x, y]) => sx(x).toFixed(1) + "," + sy(y).toFixed(1)).join(" "), class: cls, stroke: color }));
    parts.forEach((p) => shade(el, (p.m.rewound || []).map((r) => [r[2], r[3], steps[p.i].name + " steps " + r[0] + "–" + r[1]]), sx, x0, x1, Tm, H - B));
    if (ref) poly(ref.reference, "series reference", "#94a3b8");
    let legendX = W - Rm;
    const legend = [];
    parts.forEach((p, n) => {
      const color = PALETTE[n % PALETTE.length];
      segments(p.pts).forEach((seg) => poly(seg, "series", color));
      const last = p.pts[p.pts.length - 1];
      legend.push([steps[p.i].name + " " + fmt(last[1]), color]);
      const tokens = p.m.series.tokens || [];  // step -> tokens, for the events
      const at = (step) => { let best = null; tokens.forEach(([s, t]) => { if (best === null || Math.abs(s - step) < Math.abs(best[0] - step)) best = [s, t]; }); return best ? best[1] : null; };
      if (p.m.events) marks(el, p.m.events.map((e) => [at(e.step), e.kind + " (" + steps[p.i].name + " step " + e.step + ")"]).filter((e) => e[0] !== null), sx, Tm, H - B);
    });
    if (ref) legend.push(["reference", "#94a3b8"]);
    legend.reverse().forEach(([text, color]) => {
      const t = svgEl("text", { x: legendX, y: 16, class: "tick value", "text-anchor": "end", fill: color }, text);
      el.appendChild(t);
      legendX -= 8 + 6.2 * text.length;
    });
    return el;
  }
  // Expert load (busiest expert / mean expert) by layer and step: a canvas, one cell per layer
  // and logged step; white is balanced, dark red is the most overloaded seen.
  function heatmap(m) {
    const cols = m.heat, layers = cols[0][1].length;
    const W = Math.max(600, (($("curves").clientWidth) || 1200) - 40), H = clamp(16 + layers * 10, 90, 260);
    const L = 64, Rm = 16, Tm = 22, B = 22, pw = W - L - Rm, ph = H - Tm - B;
    let hi = 1;
    cols.forEach(([, v]) => v.forEach((x) => { hi = Math.max(hi, x); }));
    const wrap = h("div", "heat");
    const title = h("div", "ctitle", "expert load max/mean by layer (rows, layer 0 at the top) and step · 1.0 (balanced, white) to " + fmt(hi) + " (dark red) · last: " + fmt(Math.max.apply(null, cols[cols.length - 1][1])));
    wrap.appendChild(title);
    const c = document.createElement("canvas");
    c.width = W; c.height = H; c.className = "heatmap";
    const ctx = c.getContext("2d");
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, W, H);
    const x0 = cols[0][0], x1 = cols[cols.length - 1][0] === x0 ? x0 + 1 : cols[cols.length - 1][0];
    const cw = Math.max(1, pw / cols.length), rh = ph / layers;
    cols.forEach(([x, v], j) => v.forEach((val, l) => {
      const f = hi > 1 ? clamp((val - 1) / (hi - 1), 0, 1) : 0;
      ctx.fillStyle = "rgb(" + Math.round(255 - 120 * f) + "," + Math.round(255 - 235 * f) + "," + Math.round(255 - 225 * f) + ")";
      ctx.fillRect(L + j * (pw / cols.length), Tm + l * rh, Math.ceil(cw), Math.ceil(rh));
    }));
    ctx.strokeStyle = "#cbd5e1"; ctx.strokeRect(L, Tm, pw, ph);
    ctx.fillStyle = "#475569"; ctx.font = "10px system-ui, sans-serif";
    ctx.textAlign = "right";
    ctx.fillText("layer 0", L - 4, Tm + 9);
    ctx.fillText("layer " + (layers - 1), L - 4, Tm + ph);
    ctx.textAlign = "left"; ctx.fillText(fmt(x0), L, H - 6);
    ctx.textAlign = "right"; ctx.fillText(fmt(x1) + " step", L + pw, H - 6);
    wrap.appendChild(c);
    return wrap;
  }
  function drawCurves() {
    const pane = $("curves");
    const have = R && R.metrics ? Object.keys(R.metrics) : [];
    pane.hidden = !have.length;
    if (!have.length) return;
    pane.textContent = "";
    const training = have.filter((k) => R.metrics[k].by_tokens);
    if (training.length) pane.appendChild(overview(training));
    have.forEach((k) => {
      const i = +k, rowEl = h("div", "curverow");
      const name = h("button", "link", steps[i].name);
      name.dataset.goto = i;
      name.addEventListener("click", () => select(i, true));
      rowEl.appendChild(name);
      const body = h("div", "curvebody");
      if (R.metrics[k].heat) body.appendChild(heatmap(R.metrics[k]));
      body.appendChild(chartsOf(R.metrics[k]));
      rowEl.appendChild(body);
      pane.appendChild(rowEl);
    });
  }

  // -- the scaling ladder (docs/ladder.md): rungs, the law on log axes with its band and the
  // target's star, the leave-future-out table, the target's curve against the predicted one, and
  // the PENDING -> HIT/MISS badge --------------------------------------------------------------------
  function table(head, rows) {
    const t = h("table", "");
    const tr = h("tr", "");
    head.forEach((c) => tr.appendChild(h("th", "", c)));
    t.appendChild(tr);
    rows.forEach((r) => {
      const row = h("tr", "");
      r.forEach((c) => row.appendChild(h("td", "", c === null || c === undefined ? "-" : String(c))));
      t.appendChild(row);
    });
    return t;
  }
  function pct(v) { return v === null || v === undefined ? "-" : (v >= 0 ? "+" : "") + v.toFixed(2) + "%"; }
  function lawAt(law, c) { return law.E + law.A * Math.pow(c, -law.alpha); }
  function lawChart(L, P, V) {
    const W = 520, H = 260, Lm = 58, Rm = 14, Tm = 22, B = 24;
    const el = svgEl("svg", { class: "chart lawchart", width: W, height: H, viewBox: "0 0 " + W + " " + H });
    const law = (L || P).law, rungs = L ? L.rungs : P.rungs;
    const tc = (P || (L && L.target) || {}).compute;
    const pts = [];
    rungs.forEach((r) => { pts.push([r.compute, r.loss]); (r.seed_losses || []).forEach((s) => pts.push([r.compute, s])); });
    const band = P ? P.band : (L && L.target ? L.target.band : null), pred = P ? P.predicted : (L && L.target ? L.target.predicted : null);
    if (tc && pred) pts.push([tc, pred]);
    if (tc && band) band.forEach((b) => { if (b !== null) pts.push([tc, b]); });
    if (V) pts.push([tc, V.landed]);
    const lx = pts.map((p) => Math.log10(p[0])), ly = pts.map((p) => Math.log10(p[1]));
    let x0 = Math.min.apply(null, lx), x1 = Math.max.apply(null, lx), y0 = Math.min.apply(null, ly), y1 = Math.max.apply(null, ly);
    const px = (x1 - x0) * 0.05 || 0.5, py = (y1 - y0) * 0.08 || 0.01;
    x0 -= px; x1 += px; y0 -= py; y1 += py;
    const sx = (c) => Lm + ((Math.log10(c) - x0) / (x1 - x0)) * (W - Lm - Rm), sy = (l) => Tm + (1 - (Math.log10(l) - y0) / (y1 - y0)) * (H - Tm - B);
    axes(el, x0, x1, y0, y1, [Lm, Tm, W - Lm - Rm, H - Tm - B], (u) => "1e" + u.toFixed(1), "");
    el.querySelectorAll("text.tick").forEach((t) => { const v = +t.textContent; if (!isNaN(v) && t.getAttribute("text-anchor") === "end") t.textContent = fmt(Math.pow(10, v)); });
    el.appendChild(svgEl("text", { x: 4, y: 14, class: "ctitle" }, "loss vs compute in FLOPs (log axes): rungs, the law, its band, the target ★"));
    const line = [];
    for (let k = 0; k <= 60; k++) { const lc = x0 + ((x1 - x0) * k) / 60; line.push([Math.pow(10, lc), lawAt(law, Math.pow(10, lc))]); }
    el.appendChild(svgEl("polyline", { class: "fitline", points: line.filter((p) => p[1] > 0).map(([c, l]) => sx(c).toFixed(1) + "," + sy(l).toFixed(1)).join(" ") }));
    rungs.forEach((r) => {
      (r.seed_losses || []).forEach((s) => el.appendChild(svgEl("circle", { class: "seed", cx: sx(r.compute), cy: sy(s), r: 2.5 })));
      const c = svgEl("circle", { class: "rung", cx: sx(r.compute), cy: sy(r.loss), r: 4 });
      c.appendChild(svgEl("title", {}, r.name + ": " + fmt(r.loss) + " at " + r.compute.toExponential(2) + " FLOPs"));
      el.appendChild(c);
    });
    if (tc && band && band[0] !== null && band[1] !== null)
      el.appendChild(svgEl("line", { class: "bandbar", x1: sx(tc), x2: sx(tc), y1: sy(band[0]), y2: sy(band[1]) }));
    if (tc && pred) {
      const x = sx(tc), y = sy(pred), star = [];
      for (let k = 0; k < 10; k++) { const a = -Math.PI / 2 + (k * Math.PI) / 5, rr = k % 2 ? 3.5 : 8; star.push((x + rr * Math.cos(a)).toFixed(1) + "," + (y + rr * Math.sin(a)).toFixed(1)); }
      const s = svgEl("polygon", { class: "star", points: star.join(" ") });
      s.appendChild(svgEl("title", {}, "predicted " + fmt(pred)));
      el.appendChild(s);
    }
    if (V) el.appendChild(svgEl("circle", { class: "landed", cx: sx(tc), cy: sy(V.landed), r: 6 }));
    return el;
  }
  function targetChart(P, V, targets) {
    const W = 520, H = 260, Lm = 58, Rm = 14, Tm = 22, B = 24;
    const el = svgEl("svg", { class: "chart targetchart", width: W, height: H, viewBox: "0 0 " + W + " " + H });
    const parts = targets.map((i) => R && R.metrics && R.metrics[String(i)] && R.metrics[String(i)].by_tokens).filter(Boolean);
    const lists = parts.concat([P.curve]);
    const band = P.band;
    const extra = [[P.tokens, band[0] !== null ? band[0] : P.predicted], [P.tokens, band[1] !== null ? band[1] : P.predicted]];
    const [x0, x1, y0, y1] = bounds(lists.concat([extra]));
    const sx = (x) => Lm + ((x - x0) / (x1 - x0)) * (W - Lm - Rm), sy = (y) => Tm + (1 - (y - y0) / (y1 - y0)) * (H - Tm - B);
    axes(el, x0, x1, y0, y1, [Lm, Tm, W - Lm - Rm, H - Tm - B], short, "tokens");
    el.appendChild(svgEl("text", { x: 4, y: 14, class: "ctitle" }, "the target's loss (solid) against the predicted curve (dashed) and its band"));
    el.appendChild(svgEl("polyline", { class: "predline", points: P.curve.map(([x, y]) => sx(x).toFixed(1) + "," + sy(y).toFixed(1)).join(" ") }));
    parts.forEach((pts, n) => el.appendChild(svgEl("polyline", { class: "series", stroke: PALETTE[n % PALETTE.length],
      points: pts.map(([x, y]) => sx(x).toFixed(1) + "," + sy(y).toFixed(1)).join(" ") })));
    if (band[0] !== null && band[1] !== null) el.appendChild(svgEl("line", { class: "bandbar", x1: sx(P.tokens), x2: sx(P.tokens), y1: sy(band[0]), y2: sy(band[1]) }));
    if (V) el.appendChild(svgEl("circle", { class: "landed", cx: sx(P.tokens), cy: sy(V.landed), r: 5 }));
    return el;
  }
  function lawLines() {  // any training step held against a law: "+2.1% above the law at 3e15 FLOPs"
    const out = [];
    for (let i = 0; i < N; i++) {
      const rec = (R && R.records && R.records[String(i)]) || steps[i].record;
      const law = rec && rec.results && rec.results.law;
      if (law && law.text) out.push(steps[i].name + ": " + law.text);
    }
    return out;
  }
  function drawLadder() {
    const pane = $("ladder"), lad = R && R.ladder;
    pane.hidden = !lad;
    if (!lad) return;
    pane.textContent = "";
    const L = lad.fit, P = lad.prediction && lad.prediction.sealed, V = lad.verdict;
    const title = h("h2", "", "scaling ladder");
    const badge = h("span", "badge " + lad.badge, lad.badge);
    badge.id = "ladder-badge";
    title.appendChild(badge);
    pane.appendChild(title);
    if (V) pane.appendChild(h("div", "line verdict", V.line));
    else if (P) pane.appendChild(h("div", "line sealed", "sealed: " + P.target + " predicted " + fmt(P.predicted) + " [" + fmt(P.band[0]) + ", " + fmt(P.band[1]) + "] at " + P.compute.toExponential(2) + " FLOPs, record " + lad.prediction.digest.slice(0, 12) + ", " + new Date(P.sealed_at * 1000).toISOString().slice(0, 16).replace("T", " ") + " UTC"));
    else pane.appendChild(h("div", "line", "no prediction sealed yet: the fit needs its rungs"));
    lawLines().forEach((t) => pane.appendChild(h("div", "line lawref", t)));
    if (!L && !P) return;
    const row = h("div", "ladderrow");
    if (L) {
      const rungs = table(["rung", "active", "tokens", "FLOPs", "loss", "seeds", "fit", "resid"],
        L.rungs.map((r, k) => {
          const p = L.report[L.report.fit_used].points[k] || {};
          return [r.name, short(r.params), short(r.tokens), r.compute.toExponential(2), fmt(r.loss),
            (r.seed_losses || []).length, p.fitted ? fmt(p.fitted) : null, pct(p.residual_pct)];
        }));
      rungs.id = "ladder-rungs";
      row.appendChild(rungs);
    }
    row.appendChild(lawChart(L, P, V));
    if (P) row.appendChild(targetChart(P, V, lad.targets || []));
    pane.appendChild(row);
    if (L) {
      const law = L.law;
      pane.appendChild(h("div", "line", "L(C) = " + fmt(law.E) + " + " + fmt(law.A) + " · C^-" + fmt(law.alpha) +
        " (floor " + (L.floor === null ? "fitted" : "pinned") + ", eval " + L.metric + ")"));
      const lfo = table(["fit on", "rung", "predicted", "band", "actual", "error", "in band", "power law", "two-point"],
        (L.report.leave_future_out || []).map((r) => [r.fit_on, r.rung, r.predicted === null ? null : fmt(r.predicted),
          r.band && r.band[0] !== null ? "[" + fmt(r.band[0]) + ", " + fmt(r.band[1]) + "]" : null, fmt(r.actual),
          pct(r.error_pct), r.in_band === null ? null : (r.in_band ? "yes" : "no"), pct(r.power_law_error_pct), pct(r.two_point_error_pct)]));
      lfo.id = "ladder-lfo";
      pane.appendChild(h("div", "line", "leave-future-out: fit on the first k rungs, predict the rest"));
      pane.appendChild(lfo);
    }
  }

  // -- live updates over http(s) ------------------------------------------------------------------------
  function pollEvery() { return 1000 * ((R && R.poll) || 10); }
  function poll() {
    if (!R || R.finished) return;
    fetch("voyage.json", { cache: "no-store" }).then((r) => (r.ok ? r.json() : null)).then((j) => {
      if (j && j.run && j.run.updated !== R.updated) { R = j.run; paint(); }
      if (!R.finished) setTimeout(poll, pollEvery());
    }).catch(() => setTimeout(poll, 3 * pollEvery()));
  }

  // -- start ----------------------------------------------------------------------------------------------
  $("status").textContent = "laying out " + boxes.length.toLocaleString() + " boxes for " + N.toLocaleString() + " steps…";
  setTimeout(() => {
    try {
      const t0 = performance.now();
      $("curves").hidden = !(R && R.metrics && Object.keys(R.metrics).length);
      draw(layout());
      paint();
      fit();
      $("status").textContent = "";
      const drawn = document.querySelectorAll("#boxes [data-step]").length;
      window.voyagePage = { steps: N, drawn: drawn, boxes: boxes.length, layoutMs: performance.now() - t0 };
      const target = decodeURIComponent(location.hash.slice(1));
      if (target && index.has(target)) select(index.get(target), true);
      requestAnimationFrame(() => requestAnimationFrame(() => {
        document.documentElement.dataset.drawn = String(Math.round(performance.now()));
      }));
      if (R && !R.finished && /^https?:$/.test(location.protocol)) setTimeout(poll, pollEvery());
    } catch (err) {
      $("status").textContent = "could not draw the plan: " + err;
      console.error(err);
    }
  }, 0);
})();

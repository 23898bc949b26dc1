"""The page that ``gpt-explain --serve`` serves: HTML, CSS and a script in one string.

The script draws the session's state on load (GET /api/state, never a step), asks the local
server for one training step when Step is pressed (POST /api/step) or to start over when Reset
is (POST /api/reset), and draws the report it gets back; changing the block, head or
position redraws from the last report at once and applies to the next step. Every number
shown carries its exact value in a ``data-value`` attribute, so that a test reading the page
can compare it with the report.
"""

PAGE = r"""<!doctype html><html lang="en"><head><meta charset="utf-8">
<title>gpt-explain: watch a GPT learn</title>
<style>
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:16px auto;
max-width:1200px;color:#1f2933;padding:0 14px}
h1{font-size:20px;margin:0 0 6px}
h2{font-size:15px;margin:14px 0 6px;border-bottom:1px solid #d0d7de}
.bar{display:flex;gap:12px;flex-wrap:wrap;align-items:end;background:#f5f7fa;padding:8px;
border-radius:6px}label{font-size:12px;color:#52606d;display:flex;flex-direction:column}
textarea{width:360px;height:38px;font:13px ui-monospace,Menlo,Consolas,monospace}
button{font-size:15px;padding:6px 18px;background:#3e7cb1;color:#fff;border:0;border-radius:5px}
button:disabled{background:#9aa5b1}#reset{background:#7b8794}
.grid{display:grid;grid-template-columns:1fr 1fr;gap:6px 24px}
table{border-collapse:collapse;font-size:12.5px}td,th{padding:2px 7px;text-align:right;
border-bottom:1px solid #eef1f4}th{background:#f5f7fa}td.l,th.l{text-align:left}
.big{font-size:22px;font-weight:bold}.ok{color:#2f9e44}.bad{color:#d64545;font-weight:bold}
.note{color:#52606d;font-style:italic}.mono{font-family:ui-monospace,Menlo,Consolas,monospace}
#error{color:#8a1c1c;background:#ffe3e3;padding:4px 8px;display:none}
</style></head><body>
<h1>gpt-explain: watch a GPT learn, one training step at a time</h1>
<p class="note" id="source"></p>
<p id="intro">Each <b>Step</b> is one training step on the prompt alone: the model predicts
every next token of the prompt, the loss is their mean cross-entropy, and AdamW moves every
weight against its gradient. With one short text to fit and nothing else to stay good at, the
loss falls within a few steps: the model memorises the prompt. The session lives in the server:
reloading the page shows it as it is and never steps; <b>Reset</b> puts the first weights back
and starts again with the prompt in the box.</p>
<div class="bar">
<label>prompt (the next Step or Reset uses it)<textarea id="prompt"></textarea></label>
<label>block<select id="layer"></select></label>
<label>head<select id="head"></select></label>
<label>position<select id="position"></select></label>
<button id="step">Step</button><button id="reset">Reset</button>
<span>step <span class="big" id="stepnum" data-value="0">0</span></span>
<span>loss (float32) <span class="big" id="loss" data-value="">-</span></span>
</div>
<p id="error"></p><div id="notes" class="note"></div>
<div class="grid">
<div><h2>Attention: block <span id="att-layer"></span>, head <span id="att-head"></span></h2>
<svg id="attention" width="420" height="420"></svg></div>
<div><h2>Loss on the prompt, step by step</h2>
<svg id="loss-chart" width="520" height="190"></svg>
<h2>Did the update do what the gradient promised?</h2><table id="change"></table>
<p class="note">The gradient predicts the loss change Σ g·Δw over every weight; the step is
then measured in float64. The ratio measured / predicted is near 1 when the step is small
enough for that straight-line prediction to hold; further from 1, the loss surface curved
under the step.</p>
<h2>Followed weights: gradient g, Adam's moments m, v, and the update Δw</h2>
<p class="note">The followed elements are picked at the first step (the largest gradient in
W_Q, W_K, W_V of the head) and kept, so the chart follows the same weights. Lines on top of
each other are expected: Adam moves each weight by about lr per step, whatever its gradient.</p>
<table id="followed"></table><svg id="followed-chart" width="520" height="150"></svg></div>
<div><h2>Gradients checked by float64 finite differences</h2><table id="fd"></table>
<h2>Tied embedding E: gradient from the logits + from the lookup</h2>
<table id="split"></table></div>
<div><h2>Next token at position <span id="pos-label"></span></h2><table id="next"></table>
<h2>Logit lens: ln_f(x)·Eᵀ after each block, at that position</h2><table id="lens"></table>
<h2>Ablation: Δloss when a head's output is zeroed</h2>
<p class="note">Δloss = loss with that head's output set to zero − loss. Positive: the head
helps predict the prompt; the darker the cell, the larger the change.</p>
<table id="ablation"></table></div>
</div>
<h2>History</h2><table id="history"></table>
<script>
"use strict";
let last = null, trace = null;
const $ = (id) => document.getElementById(id);
const none = (x) => x === null || x === undefined;
const fmt = (x, d) => none(x) ? "-" : Number(x).toFixed(d);
const sci = (x, d = 4) => none(x) ? "-" : Number(x).toExponential(d);
const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({"&": "&amp;", "<": "&lt;",
  ">": "&gt;", '"': "&quot;"})[c]);
const tok = (s) => esc(JSON.stringify(s));
// a number with its exact value alongside, for readers and for tests
const num = (x, text) => `<span data-value="${none(x) ? "" : String(x)}">${text}</span>`;
const th = (cells) => "<tr>" + cells.map((c, i) =>
  `<th${i ? "" : " class='l'"}>${c}</th>`).join("") + "</tr>";
const td = (cells, cls = "") => `<tr class="${cls}">` + cells.map((c, i) =>
  `<td${i ? "" : " class='l mono'"}>${c}</td>`).join("") + "</tr>";

function options(sel, n, keep) {
  const v = Math.max(0, Math.min(n - 1, Number(keep)));
  sel.innerHTML = Array.from({length: n}, (_, i) => `<option value="${i}">${i}</option>`)
    .join("");
  sel.value = String(Number.isFinite(v) ? v : 0);
}

function cellRect(a, x, y, cell, i, j) {
  const c = (lo, hi) => Math.round(lo + a * (hi - lo));
  const fill = `rgb(${c(247, 8)},${c(251, 48)},${c(255, 107)})`;
  let out = `<rect class="cell" data-value="${a}" x="${x}" y="${y}" width="${cell}" ` +
    `height="${cell}" fill="${fill}" stroke="#fff"><title>t=${i} -> s=${j}: ` +
    `${a.toFixed(4)}</title></rect>`;
  if (cell >= 34) {
    out += `<text x="${x + cell / 2}" y="${y + cell / 2 + 4}" font-size="10" ` +
      `text-anchor="middle" fill="${a > 0.5 ? "#fff" : "#1f2933"}">${a.toFixed(2)}</text>`;
  }
  return out;
}

function colourScale(x, y, width) {  // the colours of 0 .. 1, under the map
  return '<defs><linearGradient id="scale"><stop offset="0" stop-color="rgb(247,251,255)"/>' +
    '<stop offset="1" stop-color="rgb(8,48,107)"/></linearGradient></defs>' +
    `<rect x="${x}" y="${y}" width="${width}" height="10" fill="url(#scale)" stroke="#9aa5b1"/>` +
    `<text x="${x}" y="${y + 21}" font-size="10">0</text>` +
    `<text x="${x + width}" y="${y + 21}" font-size="10" text-anchor="end">1</text>` +
    `<text x="${x}" y="${y + 34}" font-size="10">` +
    "attention weight (softmax: each row sums to 1)</text>";
}

function heatmap(w, labels) {
  const T = w.length, pad = 90, cell = Math.max(12, Math.min(40, Math.floor(320 / T)));
  const size = pad + T * cell, svg = $("attention"), width = T * cell;
  svg.setAttribute("width", Math.max(size, 340)); svg.setAttribute("height", size + 52);
  let out = `<text x="${pad + width / 2}" y="11" font-size="11" text-anchor="middle" ` +
    'font-weight="bold">key s (the token attended to) →</text>' +
    `<text transform="translate(11,${pad + width / 2}) rotate(-90)" font-size="11" ` +
    'text-anchor="middle" font-weight="bold">query t (the token attending) →</text>' +
    colourScale(pad, size + 8, Math.max(width, 240));
  for (let i = 0; i < T; i++) {
    const lab = esc(JSON.stringify(labels[i]).slice(0, 12)), mid = pad + i * cell + cell / 2;
    out += `<text x="${pad - 4}" y="${mid + 4}" text-anchor="end" font-size="11">${lab}</text>`;
    out += `<text transform="translate(${mid + 4},${pad - 4}) rotate(-55)" font-size="11">` +
      `${lab}</text>`;
    for (let j = 0; j < T; j++) {
      const x = pad + j * cell, y = pad + i * cell;
      out += j > i ? `<rect class="cell masked" x="${x}" y="${y}" width="${cell}" ` +
        `height="${cell}" fill="#e4e7eb" stroke="#fff"/>` : cellRect(w[i][j], x, y, cell, i, j);
    }
  }
  svg.innerHTML = out;
}

const DASHES = ["", "7 4", "2 3", "9 3 2 3"];

function chart(svg, series, w, h, ytitle) {
  const all = series.flatMap((s) => s.ys).filter((v) => v !== null);
  if (!all.length) { svg.innerHTML = ""; return; }
  let lo = Math.min(...all), hi = Math.max(...all);
  if (hi <= lo) hi = lo + 1e-12;
  const n = Math.max(...series.map((s) => s.ys.length)), left = 70;
  const y0 = h - 30 - (series.length > 1 ? 14 : 0);  // the x axis
  const px = (k) => left + (n > 1 ? k / (n - 1) : 0.5) * (w - left - 12);
  const py = (y) => y0 - (y - lo) / (hi - lo) * (y0 - 10);
  const text = (x, y, s, more = "") =>
    `<text x="${x}" y="${y}" font-size="10" ${more}>${s}</text>`;
  let out = `<path d="M${left},6 V${y0} H${w - 6}" fill="none" stroke="#9aa5b1"/>` +
    text(left - 4, py(hi) + 4, hi.toPrecision(4), 'text-anchor="end"') +
    text(left - 4, py(lo) + 4, lo.toPrecision(4), 'text-anchor="end"') +
    `<text transform="translate(12,${y0 / 2 + 4}) rotate(-90)" font-size="11" ` +
    `text-anchor="middle">${esc(ytitle)}</text>` +
    text(px(0), y0 + 13, "1", 'text-anchor="middle"') +
    (n > 1 ? text(px(n - 1), y0 + 13, n, 'text-anchor="middle"') : "") +
    text((left + w) / 2, y0 + 25, "step", 'text-anchor="middle"');
  series.forEach((s, k) => {
    const pts = s.ys.map((y, i) => y === null ? "" : `${px(i).toFixed(1)},${py(y).toFixed(1)}`);
    out += `<polyline fill="none" stroke="${s.color}" stroke-width="1.6" ` +
      `stroke-dasharray="${DASHES[k % 4]}" points="${pts.join(" ")}"/>`;
    if (series.length > 1) out += text(left + 140 * k, h - 3, esc(s.label), `fill="${s.color}"`);
  });
  svg.innerHTML = out;
}

function drawChange(r) {
  const c = r.loss_change;
  $("change").innerHTML = th(["loss before (float64)", "after (float64)", "measured ΔL",
    "predicted Σ g·Δw", "ratio"]) + (c ? td([fmt(c.loss_before, 6), fmt(c.loss_after, 6),
    num(c.measured, sci(c.measured)), num(c.predicted, sci(c.predicted)), fmt(c.ratio, 4)],
    "change") : "<tr><td colspan=5>checks are off</td></tr>");
}

function drawFollowed(r) {
  $("followed").innerHTML = th(["weight", "w before", "g", "m", "v", "Δw"]) +
    r.followed.map((f) => td([`<span title="${esc(f.param)}">${esc(f.label)}[${f.index}]</span>`,
      num(f.value, fmt(f.value, 6)), num(f.grad, sci(f.grad)), sci(f.m), sci(f.v),
      num(f.update, sci(f.update))], "followed")).join("");
  const colors = ["#3e7cb1", "#d64545", "#2f9e44", "#f08c00"], steps = trace.steps;
  chart($("followed-chart"), trace.followed.map((f, k) => ({
    label: f.label, color: colors[k % 4],
    ys: steps.map((s) => s.followed[k].value - steps[0].followed[k].value)})), 520, 150,
    "w − w at step 1");
}

function drawChecks(r) {
  $("fd").innerHTML = th(["element", "tape ∂L/∂w (float32)", "finite diff. (float64)",
    "rel. error", ""]) + r.finite_differences.map((e) => td([`${esc(e.label)}[${e.index}]`,
    num(e.grad, sci(e.grad)), num(e.fd, sci(e.fd)), sci(e.rel_err, 1),
    `<span class="${e.agree ? "ok" : "bad"}">${e.agree ? "agree" : "DISAGREE"}</span>`],
    "fd")).join("");
  const s = r.embedding_split;
  $("split").innerHTML = !s.tied ? "<tr><td>untied: the unembedding is its own matrix</td></tr>"
    : th(["‖from logits‖", "‖from lookup‖", "‖sum‖", "‖E.grad‖", "max |sum − grad|"]) +
    td([fmt(s.logits_norm, 6), fmt(s.lookup_norm, 6), fmt(s.sum_norm, 6),
      fmt(s.total_norm, 6), num(s.max_abs_diff, sci(s.max_abs_diff, 1))], "split");
}

function drawPosition(r, t) {
  const p = r.predictions[t];
  $("pos-label").textContent =
    `${t} (after ${JSON.stringify(p.input)}, target ${JSON.stringify(p.target)})`;
  $("next").innerHTML = th(["token", "p"]) + p.top.map((e) => td([tok(e.token) +
    (e.id === p.target_id ? " ← target" : ""), num(e.prob, fmt(e.prob, 5))])).join("");
  $("lens").innerHTML = !r.lens ? "" : th(["read after", "lens loss", "p(target)", "top"]) +
    r.lens.layers.map((l) => {
      const q = l.positions[t];
      const top = q.top.map((e) => `${tok(e.token)} ${fmt(e.prob, 3)}`).join(", ");
      return td([esc(l.after), num(l.loss, fmt(l.loss, 4)),
        num(q.target_prob, fmt(q.target_prob, 5)), top], "lens");
    }).join("");
}

function drawAblation(r) {
  const a = r.ablation;
  if (!a) { $("ablation").innerHTML = ""; return; }
  const big = Math.max(...a.delta.flat().map(Math.abs), 1e-12);
  const shown = (x) => (x >= 0 ? "+" : "−") +
    (Math.abs(x) >= 1e-3 ? Math.abs(x).toFixed(4) : Math.abs(x).toExponential(1));
  const tint = (x) => `rgba(${x >= 0 ? "214,69,69" : "62,124,177"},${(0.35 * Math.abs(x) / big)
    .toFixed(2)})`;
  const cell = (x, i, h) => `<td class="abl" data-layer="${i}" data-head="${h}" ` +
    `data-value="${x}" style="background:${tint(x)}">${shown(x)}</td>`;
  $("ablation").innerHTML = th(["block \\ head", ...a.delta[0].map((_, h) => h)]) +
    a.delta.map((row, i) => `<tr><td>${i}</td>` + row.map((x, h) => cell(x, i, h)).join("") +
      "</tr>").join("");
}

const PANES = ["notes", "pos-label", "loss-chart", "change", "followed", "followed-chart", "fd",
  "split", "next", "lens", "ablation", "history"];

function drawEmpty() {  // no step yet (or just reset): nothing stale stays on the page
  $("stepnum").textContent = "0"; $("stepnum").dataset.value = "0";
  $("loss").textContent = "-"; $("loss").dataset.value = "";
  PANES.forEach((id) => { $(id).innerHTML = ""; });
  $("attention").innerHTML = '<text x="10" y="20">Press Step to run the first training step.' +
    "</text>";
}

function draw() {
  if (!last) { drawEmpty(); return; }
  const r = last, L = Number($("layer").value), H = Number($("head").value);
  const t = Math.min(Number($("position").value), r.dims.T - 1);
  $("stepnum").textContent = r.step; $("stepnum").dataset.value = r.step;
  $("loss").textContent = fmt(r.loss.value, 6); $("loss").dataset.value = String(r.loss.value);
  $("notes").innerHTML = r.notes.map((n) => `<div>note: ${esc(n)}</div>`).join("");
  $("att-layer").textContent = L; $("att-head").textContent = H;
  if (L < r.attention_all.length) heatmap(r.attention_all[L][H], r.tokens.text.slice(0, -1));
  else $("attention").innerHTML = `<text x="10" y="20">block ${L}: beyond the output bound</text>`;
  const steps = trace.steps;
  chart($("loss-chart"), [{label: "loss", color: "#3e7cb1", ys: steps.map((s) => s.loss)}],
    520, 190, "loss on the prompt");
  $("history").innerHTML = "<tr><th>step</th><th>loss</th></tr>" + steps.map((s) =>
    `<tr class="hist" data-step="${s.step}"><td>${s.step}</td>` +
    `<td>${num(s.loss, fmt(s.loss, 6))}</td></tr>`).join("");
  drawChange(r); drawFollowed(r); drawChecks(r); drawPosition(r, t); drawAblation(r);
}

function setup(state) {
  trace = state.trace; last = state.report;
  $("source").textContent = state.source || "";
  if (!$("prompt").value) $("prompt").value = trace.prompt;
  options($("layer"), trace.config.n_layer, trace.layer);
  options($("head"), trace.config.n_head, trace.head);
  if (last) {
    const cur = $("position").value;
    options($("position"), last.dims.T, cur === "" ? last.dims.T - 1 : cur);
  }
  draw();
}

async function send(path, body) {
  $("step").disabled = $("reset").disabled = true; $("error").style.display = "none";
  try {
    const res = await fetch(path, {method: "POST", body: JSON.stringify(body),
      headers: {"Content-Type": "application/json"}});
    const state = await res.json();
    if (!res.ok) throw new Error(state.error || res.statusText);
    setup(state);
    return true;
  } catch (e) {
    $("error").textContent = String(e.message || e); $("error").style.display = "block";
    return false;
  } finally {
    $("step").disabled = $("reset").disabled = false;
  }
}

function step() {
  const body = {prompt: $("prompt").value, layer: Number($("layer").value),
    head: Number($("head").value)};
  // a new prompt may be shorter: its position defaults to the last one
  if (last && body.prompt === last.prompt && $("position").value !== "") {
    body.position = Number($("position").value);
  }
  return send("/api/step", body);
}

function reset() {
  if (!last || confirm("Put the first weights back and forget every step?")) {
    return send("/api/reset", {prompt: $("prompt").value});
  }
}

["layer", "head", "position"].forEach((id) => $(id).addEventListener("change", draw));
$("step").addEventListener("click", step);
$("reset").addEventListener("click", reset);
(async () => {
  // loading never steps: ?autostep=N steps only until the session has run N steps, so a
  // reload (or a load cut short) adds none
  setup(await (await fetch("/api/state")).json());
  const n = Math.min(Number(new URLSearchParams(location.search).get("autostep")) || 0, 50);
  while (trace.steps.length < n && await step()) { /* one step at a time */ }
  document.body.dataset.ready = "1";
})();
</script></body></html>
"""

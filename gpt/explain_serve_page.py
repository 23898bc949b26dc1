"""The page that ``gpt-explain --serve`` serves: HTML, CSS and a script in one string.

The script asks the local server for one training step at a time (POST /api/step) and draws
the report it gets back; changing the block, head or position redraws from the last report at
once and applies to the next step. Every number shown carries its exact value in a
``data-value`` attribute, so that a test reading the page can compare it with the report.
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
button:disabled{background:#9aa5b1}
.grid{display:grid;grid-template-columns:1fr 1fr;gap:6px 24px}
table{border-collapse:collapse;font-size:12.5px}td,th{padding:2px 7px;text-align:right;
border-bottom:1px solid #eef1f4}th{background:#f5f7fa}td.l,th.l{text-align:left}
.big{font-size:22px;font-weight:bold}.ok{color:#2f9e44}.bad{color:#d64545;font-weight:bold}
.note{color:#52606d;font-style:italic}.mono{font-family:ui-monospace,Menlo,Consolas,monospace}
#error{color:#8a1c1c;background:#ffe3e3;padding:4px 8px;display:none}
</style></head><body>
<h1>gpt-explain: watch a GPT learn, one training step at a time</h1>
<p class="note" id="source"></p>
<div class="bar">
<label>prompt<textarea id="prompt"></textarea></label>
<label>block<select id="layer"></select></label>
<label>head<select id="head"></select></label>
<label>position<select id="position"></select></label>
<button id="step">Step</button>
<span>step <span class="big" id="stepnum" data-value="0">0</span></span>
<span>loss <span class="big" id="loss" data-value="">-</span></span>
</div>
<p id="error"></p><div id="notes" class="note"></div>
<div class="grid">
<div><h2>Attention: block <span id="att-layer"></span>, head <span id="att-head"></span></h2>
<svg id="attention" width="420" height="420"></svg></div>
<div><h2>Loss on the prompt, step by step</h2>
<svg id="loss-chart" width="520" height="170"></svg>
<h2>Did the update do what the gradient promised?</h2><table id="change"></table>
<h2>Followed weights (Adam's moments m, v), fixed at the first step</h2>
<table id="followed"></table><svg id="followed-chart" width="520" height="130"></svg></div>
<div><h2>Gradients checked by float64 finite differences</h2><table id="fd"></table>
<h2>Tied embedding E: gradient from the logits + from the lookup</h2>
<table id="split"></table></div>
<div><h2>Next token at position <span id="pos-label"></span></h2><table id="next"></table>
<h2>Logit lens: ln_f(x)·Eᵀ after each block, at that position</h2><table id="lens"></table>
<h2>Ablation: Δloss when a head's output is zeroed</h2><table id="ablation"></table></div>
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

function heatmap(w, labels) {
  const T = w.length, pad = 90, cell = Math.max(12, Math.min(40, Math.floor(320 / T)));
  const size = pad + T * cell, svg = $("attention");
  svg.setAttribute("width", size); svg.setAttribute("height", size);
  let out = "";
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

function chart(svg, series, w, h) {
  const all = series.flatMap((s) => s.ys).filter((v) => v !== null);
  if (!all.length) { svg.innerHTML = ""; return; }
  let lo = Math.min(...all), hi = Math.max(...all);
  if (hi <= lo) hi = lo + 1e-12;
  const n = Math.max(...series.map((s) => s.ys.length)), pad = 46;
  const px = (k) => pad + (n > 1 ? k / (n - 1) : 0.5) * (w - pad - 8);
  const py = (y) => h - 18 - (y - lo) / (hi - lo) * (h - 32);
  let out = `<text x="2" y="${py(hi) + 4}" font-size="9">${hi.toPrecision(4)}</text>` +
    `<text x="2" y="${py(lo) + 4}" font-size="9">${lo.toPrecision(4)}</text>`;
  series.forEach((s, k) => {
    const pts = s.ys.map((y, i) => y === null ? "" : `${px(i).toFixed(1)},${py(y).toFixed(1)}`);
    out += `<polyline fill="none" stroke="${s.color}" stroke-width="1.6" ` +
      `points="${pts.join(" ")}"/><text x="${pad + 150 * k}" y="${h - 3}" font-size="10" ` +
      `fill="${s.color}">${esc(s.label)}</text>`;
  });
  svg.innerHTML = out;
}

function drawChange(r) {
  const c = r.loss_change;
  $("change").innerHTML = th(["loss before", "after (float64)", "measured ΔL",
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
    label: `${f.label}: w − w(step 1)`, color: colors[k % 4],
    ys: steps.map((s) => s.followed[k].value - steps[0].followed[k].value)})), 520, 130);
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
  const cell = (x, i, h) => `<td class="abl" data-layer="${i}" data-head="${h}" ` +
    `data-value="${x}">${x >= 0 ? "+" : ""}${x.toExponential(3)}</td>`;
  $("ablation").innerHTML = th(["block \\ head", ...a.delta[0].map((_, h) => h)]) +
    a.delta.map((row, i) => `<tr><td>${i}</td>` + row.map((x, h) => cell(x, i, h)).join("") +
      "</tr>").join("");
}

function draw() {
  if (!last) return;
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
    520, 170);
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

async function step() {
  $("step").disabled = true; $("error").style.display = "none";
  try {
    const body = {prompt: $("prompt").value, layer: Number($("layer").value),
      head: Number($("head").value)};
    // a new prompt may be shorter: its position defaults to the last one
    if (last && body.prompt === last.prompt && $("position").value !== "") {
      body.position = Number($("position").value);
    }
    const res = await fetch("/api/step", {method: "POST", body: JSON.stringify(body),
      headers: {"Content-Type": "application/json"}});
    const state = await res.json();
    if (!res.ok) throw new Error(state.error || res.statusText);
    setup(state);
  } catch (e) {
    $("error").textContent = String(e.message || e); $("error").style.display = "block";
  } finally {
    $("step").disabled = false;
  }
}

["layer", "head", "position"].forEach((id) => $(id).addEventListener("change", draw));
$("step").addEventListener("click", step);
(async () => {
  setup(await (await fetch("/api/state")).json());
  const n = Number(new URLSearchParams(location.search).get("autostep") || 0);
  for (let k = 0; k < Math.min(n, 50); k++) await step();
  document.body.dataset.ready = "1";
})();
</script></body></html>
"""

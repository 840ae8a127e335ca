// tinkertrace ui: local times, metric plots (uPlot), live refresh, token details. No network but this app.
"use strict";
(function () {
  const POLL_MS = 2000;
  const COLORS = ["#5b3cc4", "#3b82f6", "#1f8a4c", "#e0a030", "#c0392b", "#d64fa0", "#0d9488", "#6b7385"];
  const $ = (sel, root) => (root || document).querySelector(sel);

  function localTimes(root) {
    for (const el of (root || document).querySelectorAll(".time[data-ms]")) {
      const ms = Number(el.dataset.ms);
      if (ms) el.textContent = new Date(ms).toLocaleString();
    }
  }

  // --- plots --------------------------------------------------------------------------------------
  // A readable number: 4 significant digits, exponent only when very large or small.
  function fmt(v) {
    if (v === null || v === undefined || Number.isNaN(v)) return "–";
    const a = Math.abs(v);
    if (a === 0) return "0";
    if (a >= 1e6 || a < 1e-3) return v.toExponential(2);
    return String(Number(v.toPrecision(4)));
  }
  const stepTicks = (u, ticks) => ticks.map((t) => (Number.isInteger(t) ? String(t) : ""));
  // One panel ({title, unit, names, values}) over xs as a uPlot chart in `box`; `style` gives a series its
  // own stroke, width or dash, `bands` fills between two series (indices in [x].concat(names)).
  function plot(box, panel, xLabel, xs, style, bands) {
    const div = document.createElement("div");
    div.className = "plot";
    div.dataset.title = panel.title;
    div.dataset.points = String(xs.length);
    div.dataset.unit = panel.unit;
    const h = document.createElement("h3");
    h.textContent = panel.title;
    div.appendChild(h);
    box.appendChild(div);
    const series = [{ label: xLabel, value: (u, v) => (v === null ? "–" : String(v)) }].concat(
      panel.names.map((name, i) => Object.assign({ label: name, stroke: COLORS[i % COLORS.length], width: 1.5,
                                                   spanGaps: true, value: (u, v) => fmt(v) }, (style || {})[name]))
    );
    new uPlot({ width: Math.max(400, div.clientWidth - 12), height: 220, series: series, bands: bands || [],
                scales: { x: { time: false } },
                axes: [{ label: xLabel, values: stepTicks },
                       { label: panel.unit, size: 64, values: (u, ticks) => ticks.map(fmt) }],
                legend: { live: true } },
              [xs].concat(panel.values), div);
    return div;
  }

  // The training metrics; the reward panel leads the page (#reward-curve), the others follow the counts.
  let plottedSteps = -1;
  async function drawPlots() {
    const box = $("#plots");
    if (!box) return;
    const res = await fetch("/api/metrics", { credentials: "same-origin" });
    if (!res.ok) return;
    const data = await res.json();
    if (data.steps.length === plottedSteps) return;
    plottedSteps = data.steps.length;
    $("#metrics-steps").textContent = `${data.steps.length} steps` + (data.log_dir ? ` · ${data.log_dir}` : "");
    if (!data.steps.length) return;
    const lead = $("#reward-curve");
    box.replaceChildren();
    if (lead && data.panels.some((panel) => panel.title === "reward")) lead.replaceChildren();
    for (const panel of data.panels) plot(panel.title === "reward" && lead ? lead : box, panel, "step", data.steps);
  }

  // Mean reward (and its quartiles, shaded) per policy version, beside the reward curve.
  const VERSION_STYLE = { mean: { stroke: COLORS[0], width: 2 }, median: { stroke: COLORS[1], width: 1, dash: [4, 3] },
                          q1: { stroke: "#9aa3b5", width: 1 }, q3: { stroke: "#9aa3b5", width: 1 } };
  async function drawVersions() {
    const box = $("#reward-by-version");
    if (!box) return;
    const res = await fetch("/api/reward_by_version", { credentials: "same-origin" });
    if (!res.ok) return;
    const data = await res.json();
    if (!data.versions.length) return;
    box.replaceChildren();
    const panel = data.panels[0];
    const bands = data.split ? [] : [{ series: [panel.names.indexOf("q3") + 1, panel.names.indexOf("q1") + 1],
                                       fill: "rgba(91, 60, 196, 0.10)" }];
    const div = plot(box, panel, "policy version", data.versions, data.split ? {} : VERSION_STYLE, bands);
    if (data.unversioned) {
      const note = document.createElement("p");
      note.className = "muted note";
      note.textContent = `not plotted: ${data.unversioned} rollouts with no policy version (the table below has them)`;
      div.appendChild(note);
    }
  }

  // --- live ---------------------------------------------------------------------------------------
  let version = Number(document.body.dataset.version);
  let versionsDrawn = null;
  async function poll() {
    try {
      const res = await fetch("/api/status", { credentials: "same-origin" });
      if (res.ok) {
        const status = await res.json();
        if (status.version !== version) {
          version = status.version;
          $("#live-version").textContent = String(version);
          $("#live").classList.add("changed");
          await onNewData(status);
        }
      }
      await drawPlots();
      if (versionsDrawn !== version) {  // the page's first poll, and after new data
        await drawVersions();
        versionsDrawn = version;
      }
      $("#live").classList.remove("offline");
    } catch (err) {
      // the server is unreachable (stopped or restarting): say so; the next poll tries again
      $("#live").classList.add("offline");
    } finally {
      setTimeout(poll, POLL_MS);
    }
  }

  async function onNewData(status) {
    const counts = { rollouts: status.rollouts, trained: status.rollouts_trained, incomplete: status.rollouts_incomplete,
                     dropped: status.rollouts_dropped, calls: status.llm_calls, tokens: status.tokens_sampled,
                     spans: status.spans, files: status.files, skipped: status.files_skipped };
    for (const [key, value] of Object.entries(counts)) {
      const el = $("#count-" + key);
      if (el) el.textContent = String(value);
    }
    const reward = $("#count-reward");
    if (reward && status.mean_reward !== null) reward.textContent = status.mean_reward.toFixed(3);
    const noSpans = $("#no-spans");
    if (noSpans && status.files > 0) noSpans.remove();
    const fraction = $("#trained-fraction");
    if (fraction && status.trained_fraction !== null) fraction.textContent = (100 * status.trained_fraction).toFixed(1) + " %";
    const parts = document.querySelectorAll("[data-live-reload]");  // rendered server-side: fetch the page again
    if (parts.length) {
      const res = await fetch(location.href, { credentials: "same-origin" });
      if (res.ok) {
        const doc = new DOMParser().parseFromString(await res.text(), "text/html");
        for (const el of parts) {
          const fresh = doc.getElementById(el.id);
          if (!fresh) continue;
          for (const folded of el.querySelectorAll("details[id]")) {  // opened or folded by the reader: kept
            const twin = fresh.querySelector(`details[id="${folded.id}"]`);
            if (twin) twin.open = folded.open;
          }
          el.replaceWith(fresh);
        }
      }
    }
    const part = $("[data-live-fragment]");
    if (part) {
      const res = await fetch(part.dataset.liveFragment, { credentials: "same-origin" });
      if (res.ok) {
        part.innerHTML = await res.text();  // our own server-rendered, escaped fragment
        localTimes(part);
      }
    }
  }

  // --- tokens -------------------------------------------------------------------------------------
  function tokenClicks() {
    const detail = $("#token-detail");
    if (!detail) return;
    document.addEventListener("click", (ev) => {
      const tok = ev.target.closest(".tok[data-i]");
      if (!tok) return;
      for (const el of document.querySelectorAll(".tok.picked")) el.classList.remove("picked");
      tok.classList.add("picked");
      const d = tok.dataset;
      detail.classList.remove("muted");
      const role = tok.classList.contains("trained") ? "trained"
        : tok.classList.contains("sampled") ? "sampled, not trained" : "prompt / observation";
      detail.textContent = `token ${d.i} · id ${d.id} · ${role}` +
        ` · sampler logprob ${d.lp} · advantage ${d.adv} · turn ${d.turn}` +
        (tok.classList.contains("retok") ? " · re-tokenised call" : "") + ` · text ${JSON.stringify(tok.textContent)}`;
      if (d.span) {  // from the token to its call: the span on the rollout page
        const link = document.createElement("a");
        link.href = location.pathname.replace("/trajectory/", "/rollouts/") + "#span-" + d.span;
        link.textContent = ` · call span ${d.span}`;
        link.id = "token-span";
        detail.appendChild(link);
      }
    });
    const colour = $("#colour-by");
    if (colour) colour.addEventListener("change", () => {
      for (const tok of document.querySelectorAll(".tokens .tok")) {
        const lp = Number(tok.dataset.lp);
        const shade = colour.value === "logprob" && tok.classList.contains("sampled") && !Number.isNaN(lp);
        tok.style.background = shade ? `hsl(0, 85%, ${100 - Math.min(1, -lp / 5) * 45}%)` : "";
      }
    });
  }

  function buildReload() {
    if ($("#build-running") || ($("h1") && $("h1").textContent === "build report" && !$("#summary-rows") && !$("#build-error"))) {
      setTimeout(() => location.reload(), 1500);
    }
  }

  localTimes();
  tokenClicks();
  buildReload();
  poll();
})();

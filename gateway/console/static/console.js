// The console's only script (no inline scripts: the pages' Content-Security-Policy forbids them).
// Tenant page: the stacked token chart and the spend chart of the month, from the JSON data
// blocks the page carries.
// Operator page: each rollout's gates against their thresholds (from the page's JSON blocks);
// the pools table and the chart of each pool's TTFT p50 over time, refreshed every few seconds
// from /console/operator/live.json without a reload (the chart keeps the last 100 polls).
// Every chart sets data-rendered on its canvas once drawn.
"use strict";

(function () {
  var COLOURS = {
    "system": "#6c8ebf", "history": "#9bb5dc", "new input": "#2f5597", "tools": "#b4c7e7",
    "uncached": "#a9d18e", "cached": "#548235", "cache write": "#c5e0b4",
    "output": "#f4b183", "reasoning": "#c55a11"
  };
  var PALETTE = ["#2f5597", "#c55a11", "#548235", "#7030a0", "#bf9000", "#1f7f7f",
                 "#a00000", "#666666"];
  var MAX_POINTS = 100;
  var POLL_MS = 3000;

  function charts() { return typeof Chart !== "undefined"; }

  function json(id) {
    var block = id ? document.getElementById(id) : null;
    return block ? JSON.parse(block.textContent) : null;
  }

  function drawUsage() {
    var usage = json("usage-data");
    var canvas = document.getElementById("usage-chart");
    if (!usage || !canvas || !charts()) { return; }
    var chart = new Chart(canvas, {
      type: "bar",
      data: {
        labels: usage.labels,
        datasets: usage.series.map(function (s) {
          return { label: s.label, stack: s.stack, data: s.data,
                   backgroundColor: COLOURS[s.label] || "#999999" };
        })
      },
      options: {
        animation: false,
        maintainAspectRatio: false,
        scales: { x: { stacked: true, title: { display: true, text: usage.month } },
                  y: { stacked: true, title: { display: true, text: "tokens" } } },
        plugins: { tooltip: { mode: "index" } }
      }
    });
    canvas.setAttribute("data-rendered", String(chart.data.datasets.length));
  }

  function drawSpend() {
    var spend = json("spend-data");
    var canvas = document.getElementById("spend-chart");
    if (!spend || !canvas || !charts()) { return; }
    var daily = spend.micros.map(function (m) { return m / 1e6; });
    var total = 0;
    var toDate = daily.map(function (v) { total += v; return total; });
    var chart = new Chart(canvas, {
      type: "bar",
      data: {
        labels: spend.labels,
        datasets: [
          { type: "bar", label: "spend per day", data: daily, backgroundColor: "#2f5597",
            yAxisID: "y" },
          { type: "line", label: "month to date", data: toDate, borderColor: "#c55a11",
            backgroundColor: "#c55a11", pointRadius: 0, yAxisID: "y1" }
        ]
      },
      options: {
        animation: false,
        maintainAspectRatio: false,
        scales: {
          x: { title: { display: true, text: spend.month } },
          y: { beginAtZero: true, title: { display: true, text: spend.currency + " per day" } },
          y1: { beginAtZero: true, position: "right", grid: { drawOnChartArea: false },
                title: { display: true, text: spend.currency + " to date" } }
        },
        plugins: { tooltip: { mode: "index", intersect: false } }
      }
    });
    canvas.setAttribute("data-rendered", String(chart.data.datasets.length));
  }

  function drawGates() {
    if (!charts()) { return; }
    var sets = [["canary", "#c55a11"], ["baseline", "#2f5597"], ["threshold", "#a6a6a6"]];
    Array.prototype.forEach.call(document.querySelectorAll("canvas.gate-chart"), function (canvas) {
      var gates = json(canvas.getAttribute("data-source"));
      if (!gates) { return; }
      new Chart(canvas, {
        type: "bar",
        data: {
          labels: gates.labels,
          datasets: sets.map(function (s) {
            return { label: s[0], key: s[0], data: gates[s[0]], backgroundColor: s[1],
                     minBarLength: 2 };  // a figure of 0 still shows
          })
        },
        options: {
          animation: false,
          maintainAspectRatio: false,
          scales: { y: { beginAtZero: true,
                         title: { display: true, text: "% of the gate's threshold" } } },
          plugins: { tooltip: { callbacks: {
            label: function (ctx) {
              var figures = gates.figures[ctx.dataIndex] || {};
              var raw = figures[ctx.dataset.key];
              return ctx.dataset.label + ": " + (raw === null || raw === undefined ? "n/a" : raw) +
                " (" + ctx.formattedValue + "%)";
            },
            footer: function (items) {
              var figures = items.length ? gates.figures[items[0].dataIndex] || {} : {};
              return figures.rule ? "threshold: " + figures.rule + " (" + figures.verdict + ")" : "";
            }
          } } }
        }
      });
      canvas.setAttribute("data-rendered", String(gates.labels.length));
    });
  }

  function cell(text) {
    var td = document.createElement("td");
    td.textContent = text === null || text === undefined ? "" : String(text);
    return td;
  }

  function row(cells, className) {
    var tr = document.createElement("tr");
    if (className) { tr.className = className; }
    cells.forEach(function (c) { tr.appendChild(cell(c)); });
    return tr;
  }

  function backendRow(b) {
    var e = b.engine;
    return row(["", b.backend, b.in_flight, "", b.ejected ? "yes" : "no", b.ttft_p50_ms,
                b.ttft_p99_ms, b.ttft_ms, b.tpot_ms, e ? e.engine : "", e ? e.waiting : "",
                e ? e.running : "", e ? (e.kv_cache * 100).toFixed(1) + "%" : ""]);
  }

  function ttftChart() {
    var canvas = document.getElementById("ttft-chart");
    if (!canvas || !charts()) { return null; }
    var chart = new Chart(canvas, {
      type: "line",
      data: { labels: [], datasets: [] },
      options: {
        animation: false,
        maintainAspectRatio: false,
        spanGaps: true,
        scales: { y: { beginAtZero: true, title: { display: true, text: "TTFT p50 (ms)" } } },
        plugins: { tooltip: { mode: "index", intersect: false } }
      }
    });
    canvas.setAttribute("data-rendered", "0");
    canvas.setAttribute("data-points", "0");
    return chart;
  }

  // One poll's per-pool p50 as the chart's newest point; the oldest past MAX_POINTS go.
  function addPoint(chart, live) {
    var data = chart.data;
    data.labels.push(new Date(live.at).toLocaleTimeString());
    live.pools.forEach(function (p) {
      var set = null;
      data.datasets.forEach(function (d) { if (d.label === p.pool) { set = d; } });
      if (!set) {
        var colour = PALETTE[data.datasets.length % PALETTE.length];
        set = { label: p.pool, data: [], borderColor: colour, backgroundColor: colour,
                pointRadius: 2 };
        while (set.data.length < data.labels.length - 1) { set.data.push(null); }
        data.datasets.push(set);
      }
      set.data.push(p.ttft_p50_ms);
    });
    var points = 0;
    data.datasets.forEach(function (d) {
      while (d.data.length < data.labels.length) { d.data.push(null); }  // a pool gone
      while (d.data.length > MAX_POINTS) { d.data.shift(); }
      d.data.forEach(function (v) { if (v !== null && v !== undefined) { points += 1; } });
    });
    while (data.labels.length > MAX_POINTS) { data.labels.shift(); }
    chart.update();
    chart.canvas.setAttribute("data-rendered", String(data.datasets.length));
    chart.canvas.setAttribute("data-points", String(points));
  }

  function refreshPools() {
    var table = document.getElementById("pools");
    if (!table) { return; }
    var body = table.querySelector("tbody");
    var stamp = document.getElementById("live-at");
    var chart = ttftChart();
    function tick() {
      fetch(table.getAttribute("data-live"), { credentials: "same-origin", cache: "no-store" })
        .then(function (r) { if (!r.ok) { throw new Error(String(r.status)); } return r.json(); })
        .then(function (live) {
          var rows = [];
          live.pools.forEach(function (p) {
            rows.push(row([p.pool, "", p.in_flight, p.queued, "", p.ttft_p50_ms, "", "", "", "",
                           "", "", ""], "pool"));
            p.backends.forEach(function (b) { rows.push(backendRow(b)); });
          });
          body.replaceChildren.apply(body, rows);
          if (chart) { addPoint(chart, live); }
          if (stamp) { stamp.textContent = new Date(live.at).toLocaleTimeString(); }
          table.setAttribute("data-refreshed", String(live.at));
        })
        .catch(function (e) { if (stamp) { stamp.textContent = "not refreshed (" + e.message + ")"; } });
    }
    tick();
    window.setInterval(tick, POLL_MS);
  }

  document.addEventListener("DOMContentLoaded", function () {
    drawUsage();
    drawSpend();
    drawGates();
    refreshPools();
  });
})();

// The console's only script (no inline scripts: the pages' Content-Security-Policy forbids them).
// Tenant page: the stacked chart of the month from the JSON data block the page carries.
// Operator page: the pools table refreshed every few seconds from /console/operator/live.json.
"use strict";

(function () {
  var COLOURS = {
    "system": "#6c8ebf", "history": "#9bb5dc", "new input": "#2f5597", "tools": "#b4c7e7",
    "uncached": "#a9d18e", "cached": "#548235", "cache write": "#c5e0b4",
    "output": "#f4b183", "reasoning": "#c55a11"
  };

  function drawChart() {
    var data = document.getElementById("usage-data");
    var canvas = document.getElementById("usage-chart");
    if (!data || !canvas || typeof Chart === "undefined") { return; }
    var usage = JSON.parse(data.textContent);
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

  function refreshPools() {
    var table = document.getElementById("pools");
    if (!table) { return; }
    var body = table.querySelector("tbody");
    var stamp = document.getElementById("live-at");
    function tick() {
      fetch(table.getAttribute("data-live"), { credentials: "same-origin", cache: "no-store" })
        .then(function (r) { if (!r.ok) { throw new Error(String(r.status)); } return r.json(); })
        .then(function (live) {
          var rows = [];
          live.pools.forEach(function (p) {
            rows.push(row([p.pool, "", p.in_flight, p.queued, "", "", ""], "pool"));
            p.backends.forEach(function (b) {
              rows.push(row(["", b.backend, b.in_flight, "", b.ejected ? "yes" : "no",
                             b.ttft_ms, b.tpot_ms]));
            });
          });
          body.replaceChildren.apply(body, rows);
          if (stamp) { stamp.textContent = new Date(live.at).toLocaleTimeString(); }
          table.setAttribute("data-refreshed", String(live.at));
        })
        .catch(function (e) { if (stamp) { stamp.textContent = "not refreshed (" + e.message + ")"; } });
    }
    tick();
    window.setInterval(tick, 3000);
  }

  document.addEventListener("DOMContentLoaded", function () {
    drawChart();
    refreshPools();
  });
})();

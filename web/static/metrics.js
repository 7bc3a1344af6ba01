// dynask admin: live charts. Each server-sent event carries one JSON point; the charts
// (uPlot, vendored) keep the last five minutes.
"use strict";
(() => {
  const script = document.currentScript;
  const KEEP = 300; // points, one a second
  const MIN_SPAN_S = 60;
  const palette = { blue: "#2563eb", red: "#dc2626", green: "#16a34a", amber: "#d97706" };
  const charts = [];

  function chart(id, series, yLabel) {
    const element = document.getElementById(id);
    const data = [[], ...series.map(() => [])];
    const plot = new uPlot({
      width: element.clientWidth || 480, height: 200,
      cursor: { drag: { x: false, y: false } },
      legend: { live: false },
      // At least a minute wide, so the first points are not stretched over the chart.
      scales: {
        x: { time: true, range: (u, min, max) => [Math.min(min, max - MIN_SPAN_S), max] },
        y: { range: (u, min, max) => [0, max > 0 ? max * 1.1 : 1] }, // from zero, always
      },
      axes: [{}, { label: yLabel, size: 60 }],
      series: [{}, ...series.map((s) => ({
        label: s.label, stroke: s.color, width: 2, spanGaps: false, points: { size: 5 },
        value: (u, v) => (v == null ? "–" : (s.format ? s.format(v) : v.toFixed(1))),
      }))],
    }, data, element);
    charts.push({ element, plot, data, series });
  }

  const percent = (v) => `${(v * 100).toFixed(0)}%`;
  const asPercent = (v) => (v == null ? null : v * 100);
  chart("chart-throughput", [{ key: "tokens_per_s", label: "tokens/s", color: palette.blue }], "tokens/s");
  chart("chart-ttft", [
    { key: "ttft_p50_ms", label: "p50", color: palette.blue },
    { key: "ttft_p99_ms", label: "p99", color: palette.red },
  ], "ms");
  chart("chart-itl", [
    { key: "itl_p50_ms", label: "p50", color: palette.blue },
    { key: "itl_p99_ms", label: "p99", color: palette.red },
  ], "ms");
  chart("chart-load", [
    { key: "kv_hit_rate", label: "KV hit rate %", color: palette.green, map: asPercent },
    { key: "in_flight", label: "in flight", color: palette.amber, format: (v) => v.toFixed(0) },
  ], "% · requests");

  const show = (id, text) => { const el = document.getElementById(id); if (el) el.textContent = text; };
  const fmt = (v, digits = 1) => (v == null ? "–" : v.toFixed(digits));

  function update(point) {
    for (const c of charts) {
      c.data[0].push(point.t);
      c.series.forEach((s, i) => c.data[i + 1].push(s.map ? s.map(point[s.key]) : point[s.key]));
      if (c.data[0].length > KEEP) c.data.forEach((column) => column.shift());
      c.plot.setData(c.data);
    }
    show("stat-tokens_per_s", fmt(point.tokens_per_s));
    show("stat-ttft", `${fmt(point.ttft_p50_ms, 0)} / ${fmt(point.ttft_p99_ms, 0)}`);
    show("stat-itl", `${fmt(point.itl_p50_ms, 0)} / ${fmt(point.itl_p99_ms, 0)}`);
    show("stat-kv_hit_rate", point.kv_hit_rate == null ? "–" : percent(point.kv_hit_rate));
    show("stat-in_flight", fmt(point.in_flight, 0));
    show("stat-requests_total", fmt(point.requests_total, 0));
    show("metrics-status", `updated ${new Date(point.t * 1000).toLocaleTimeString()}`);
  }

  const source = new EventSource(script.dataset.feed);
  source.addEventListener(script.dataset.event, (event) => update(JSON.parse(event.data)));
  source.onerror = () => show("metrics-status", "disconnected; reconnecting…");
  window.addEventListener("resize", () => {
    for (const c of charts) c.plot.setSize({ width: c.element.clientWidth, height: 200 });
  });
})();

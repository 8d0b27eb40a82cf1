import { Filters, el, info } from "./common.js";

const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs = {}, text = null) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
  if (text !== null) node.textContent = text;
  return node;
}

function short(value) {
  const a = Math.abs(value);
  if (a >= 1e9) return `${(value / 1e9).toPrecision(3)}G`;
  if (a >= 1e6) return `${(value / 1e6).toPrecision(3)}M`;
  if (a >= 1e4) return `${(value / 1e3).toPrecision(3)}k`;
  return Number.isInteger(value) ? String(value) : value.toPrecision(3);
}

// Horizontal bars: one row per item ({name, value}), for labels and shards.
function hbars(items, unit = "") {
  const longest = Math.max(4, ...items.map((d) => d.name.length));
  const row = 18, left = Math.min(320, 12 + longest * 6.5), width = 560;
  const max = Math.max(1, ...items.map((d) => d.value));
  const chart = svg("svg", { width: left + width + 70, height: items.length * row + 4, class: "chart", role: "img" });
  items.forEach((d, i) => {
    const y = i * row + 2;
    chart.append(svg("text", { x: left - 6, y: y + 13, "text-anchor": "end", class: "axis" }, d.name));
    const bar = svg("rect", { x: left, y, width: Math.max(1, (d.value / max) * width), height: row - 4, class: "bar" });
    bar.append(svg("title", {}, `${d.name}: ${d.value.toLocaleString("en")}${unit}`));
    chart.append(bar, svg("text", { x: left + (d.value / max) * width + 4, y: y + 13, class: "axis" }, short(d.value) + unit));
  });
  return chart;
}

// A histogram: counts over bins with edges[i]..edges[i+1].
function histogram(edges, counts) {
  const height = 120, width = 600, pad = 30;
  const max = Math.max(1, ...counts);
  const chart = svg("svg", { width: width + pad * 2, height: height + 34, class: "chart", role: "img" });
  const w = width / Math.max(1, counts.length);
  counts.forEach((c, i) => {
    const h = (c / max) * height;
    const bar = svg("rect", { x: pad + i * w, y: height - h + 4, width: Math.max(1, w - 1), height: h, class: "bar" });
    bar.append(svg("title", {}, `${short(edges[i])} – ${short(edges[i + 1])}: ${c.toLocaleString("en")}`));
    chart.append(bar);
  });
  chart.append(svg("text", { x: pad, y: height + 22, class: "axis" }, short(edges[0])));
  chart.append(svg("text", { x: pad + width, y: height + 22, "text-anchor": "end", class: "axis" }, short(edges[edges.length - 1])));
  chart.append(svg("text", { x: pad + width, y: 14, "text-anchor": "end", class: "axis" }, `max ${max.toLocaleString("en")}`));
  return chart;
}

// Width x height: a heat map of counts, darker where more images have that size.
function heatmap(sizes) {
  const cell = 14, pad = 40, n = sizes.counts.length, m = sizes.counts[0].length;
  const max = Math.max(1, ...sizes.counts.flat());
  const chart = svg("svg", { width: pad + n * cell + 10, height: m * cell + pad, class: "chart", role: "img" });
  sizes.counts.forEach((column, i) => column.forEach((c, j) => {
    if (!c) return;
    const rect = svg("rect", { x: pad + i * cell, y: (m - 1 - j) * cell, width: cell - 1, height: cell - 1, class: "bar", "fill-opacity": 0.15 + 0.85 * Math.log1p(c) / Math.log1p(max) });
    rect.append(svg("title", {}, `width ${short(sizes.width_edges[i])}–${short(sizes.width_edges[i + 1])}, height ${short(sizes.height_edges[j])}–${short(sizes.height_edges[j + 1])}: ${c}`));
    chart.append(rect);
  }));
  chart.append(svg("text", { x: pad, y: m * cell + 16, class: "axis" }, `width ${short(sizes.width_edges[0])}`));
  chart.append(svg("text", { x: pad + n * cell, y: m * cell + 16, "text-anchor": "end", class: "axis" }, short(sizes.width_edges[n])));
  chart.append(svg("text", { x: 2, y: 12, class: "axis" }, short(sizes.height_edges[m])));
  chart.append(svg("text", { x: 2, y: m * cell, class: "axis" }, short(sizes.height_edges[0])));
  chart.append(svg("text", { x: 2, y: m * cell + 30, class: "axis" }, "height ↑"));
  return chart;
}

function show(id, chart) {
  const figure = document.getElementById(id);
  figure.querySelector("svg")?.remove();
  if (chart) figure.append(chart);
  figure.hidden = !chart;
}

async function load() {
  const p = filters.params();
  document.getElementById("nav-grid").href = `/?${p}`;
  const data = await filters.latest(`/api/plots?${p}`);
  if (!data) return;
  document.getElementById("count").textContent = `${data.total.toLocaleString("en")} of ${info.num_samples.toLocaleString("en")} samples`;
  show("plot-labels", data.labels.length ? hbars(data.labels.map((d) => ({ name: d.name, value: d.count }))) : null);
  show("plot-sizes", data.sizes ? heatmap(data.sizes) : null);
  show("plot-shards", hbars(data.shards.map((s) => ({ name: s.name, value: s.bytes })), "B"));
  const box = document.getElementById("histograms");
  box.replaceChildren(...Object.entries(data.histograms).filter(([, h]) => h.counts.length).map(([name, h]) =>
    el("figure", { class: "plot histogram", "data-column": name }, el("figcaption", {}, name), histogram(h.edges, h.counts))));
  history.replaceState(null, "", `?${p}`);
  document.body.dataset.loaded = String(filters.asked); // the request just shown
  document.body.dataset.loadedMs = String(Math.round(performance.now()));
}
const filters = new Filters(info, load);
load();

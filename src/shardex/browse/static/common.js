// Shared helpers of the browser's pages. Every text from the export is put in the page
// with textContent or setAttribute, never parsed as HTML.

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(typeof child === "string" || typeof child === "number" ? String(child) : child);
  }
  return node;
}

// What the server says of the split (columns, labels, page size), given in the page.
export const info = JSON.parse(document.getElementById("info").textContent);

// URL parameters naming the split shown, added to params where the export has several
// (the server shows the split named at start otherwise).
export function splitParams(params = {}) {
  const p = new URLSearchParams(params);
  if (info.splits.length > 1) p.set("split", info.split);
  return p;
}

// The header's split selector: the grid (or the plots) of another split, same filters.
document.getElementById("split")?.addEventListener("change", (event) => {
  const params = new URLSearchParams(location.search);
  for (const name of ["offset", "key"]) params.delete(name);
  params.set("split", event.target.value);
  location.assign(`${location.pathname === "/plots" ? "/plots" : "/"}?${params}`);
});

export async function getJSON(url) {
  const response = await fetch(url);
  const body = await response.json().catch(() => ({ error: response.statusText }));
  if (!response.ok) throw new Error(body.error || `${response.status} ${response.statusText}`);
  return body;
}

export function format(value) {
  if (typeof value === "number" && !Number.isInteger(value)) return value.toPrecision(4);
  if (Array.isArray(value)) return `[${value.length} values]`;
  if (value === null || value === undefined) return "—";
  return String(value);
}

// "go to key" carries the page's query: a key not found shows the grid it was asked
// from (its filters, order and page), saying so.
const find = document.querySelector("form.find");
find.addEventListener("submit", () => {
  for (const [name, value] of new URLSearchParams(location.search)) {
    if (!find.elements[name]) find.append(el("input", { type: "hidden", name, value }));
  }
});

// A thumbnail tile linking to the sample page (its URL carries query: the grid's filters
// and order, for the sample page's previous and next); under it, the shown columns and,
// for a similar-images result, its cosine similarity. A sample that cannot be read
// becomes an error tile (the server answers its thumbnail with an error status).
export function tile(row, info, { shown = [], query = splitParams(), cosine } = {}) {
  const link = el("a", { class: "tile", href: `/sample/${row.index}${query.size ? `?${query}` : ""}`, "data-index": row.index });
  const img = el("img", { src: `/thumb/${row.index}?${splitParams({ size: 160 })}`, alt: row.key ?? "", loading: "lazy", decoding: "async" });
  img.addEventListener("error", () => {
    link.classList.add("error");
    img.replaceWith(el("div", { class: "error-tile" }, "cannot read this sample", el("br"), "(open it for details)"));
  });
  link.append(el("div", { class: "thumb" }, img), el("div", { class: "key", title: row.key }, row.key ?? String(row.index)));
  if (info.label) link.append(el("div", { class: "label" }, row.label_name ?? ""));
  for (const name of shown) link.append(el("div", { class: "meta" }, `${name}: ${format(row[name])}`));
  if (cosine !== undefined) link.append(el("div", { class: "meta score" }, `cosine ${cosine}`));
  return link;
}

// The filter form (labels, ranges, text, expression), filled from and kept in the URL.
export class Filters {
  constructor(info, onChange) {
    this.asked = 0; // requests made by latest()
    this.info = info;
    this.form = document.getElementById("filters");
    this.onChange = onChange;
    const url = new URLSearchParams(location.search);
    this.buildLabels(url);
    this.buildRanges(url);
    const column = document.getElementById("text-column");
    for (const name of info.text) column.append(el("option", { value: name, selected: url.get("in") === name }, name));
    document.getElementById("text").value = url.get("q") ?? "";
    document.getElementById("expr").value = url.get("expr") ?? "";
    let timer = null;
    this.form.addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(() => onChange(), 250); });
    this.form.addEventListener("change", () => { clearTimeout(timer); onChange(); });
    this.form.addEventListener("submit", (event) => { event.preventDefault(); clearTimeout(timer); onChange(); });
  }

  buildLabels(url) {
    if (!this.info.label) return;
    const box = document.getElementById("labels");
    box.hidden = false;
    const chosen = new Set(url.getAll("label"));
    const names = this.info.label_names;
    const values = names.length ? names.map((_, i) => i) : this.info.label_values;
    this.labelCounts = new Map();
    const choices = box.querySelector(".choices");
    for (const value of values) {
      const n = el("span", { class: "n" });
      this.labelCounts.set(String(value), n);
      choices.append(el("label", { class: "choice" },
        el("input", { type: "checkbox", name: "label", value, checked: chosen.has(String(value)) }),
        ` ${names[value] ?? value} `, n));
    }
  }

  buildRanges(url) {
    if (!this.info.numeric.length) return;
    const box = document.getElementById("ranges");
    box.hidden = false;
    for (const name of this.info.numeric) {
      box.append(el("div", { class: "range" }, el("span", {}, name),
        el("input", { type: "number", step: "any", name: `min.${name}`, placeholder: "min", value: url.get(`min.${name}`) ?? "", "aria-label": `${name} min` }),
        el("input", { type: "number", step: "any", name: `max.${name}`, placeholder: "max", value: url.get(`max.${name}`) ?? "", "aria-label": `${name} max` })));
    }
  }

  // The filters' URL parameters, and the split's.
  params() {
    const params = splitParams();
    for (const [name, value] of new FormData(this.form)) {
      if (value !== "" && !(name === "in" && value === "key" && !this.form.elements.q.value)) params.append(name, value);
    }
    return params;
  }

  showCounts(counts) {
    if (!this.labelCounts) return;
    for (const [label, node] of this.labelCounts) node.textContent = `(${counts[label] ?? 0})`;
  }

  status(text, isError = false) {
    const node = document.getElementById("status");
    node.textContent = text;
    node.classList.toggle("error", isError);
  }

  // The JSON at url, its label counts shown; null when the request failed (the error is
  // shown) or when a newer request was made meanwhile: only the newest may fill the page.
  async latest(url) {
    const asked = ++this.asked;
    let data;
    try {
      data = await getJSON(url);
    } catch (error) {
      this.status(error.message, true);
      return null;
    }
    if (asked !== this.asked) return null;
    this.status("");
    this.showCounts(data.label_counts);
    return data;
  }
}

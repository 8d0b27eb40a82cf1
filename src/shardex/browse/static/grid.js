import { Filters, el, info, tile } from "./common.js";

const url = new URLSearchParams(location.search);
let offset = Number.parseInt(url.get("offset") ?? "0", 10) || 0;
const limit = Math.min(Number.parseInt(url.get("limit") ?? "", 10) || info.page_size, 200);
const order = document.getElementById("order");
for (const name of info.orderable) order.append(el("option", { value: name, selected: url.get("order") === name }, name));
document.getElementById("desc").checked = url.get("desc") === "1";
const shownBox = document.getElementById("shown-columns");
const wanted = url.has("col") ? new Set(url.getAll("col")) : new Set(info.shown.slice(0, 2));
for (const name of info.shown) {
  shownBox.append(el("label", { class: "choice" }, el("input", { type: "checkbox", name: "col", value: name, checked: wanted.has(name) }), ` ${name}`));
}
const filters = new Filters(info, () => { offset = 0; load(); });
document.getElementById("view").addEventListener("change", () => { offset = 0; load(); });

function params() {
  const p = filters.params();
  for (const [name, value] of new FormData(document.getElementById("view"))) if (value !== "") p.append(name, value);
  return p;
}

async function load() {
  const p = params();
  document.getElementById("nav-plots").href = `/plots?${filters.params()}`;
  const query = new URLSearchParams(p);
  query.set("offset", offset);
  query.set("limit", limit);
  const page = await filters.latest(`/api/page?${query}`);
  if (!page) return;
  const shown = p.getAll("col");
  if (limit !== info.page_size) p.set("limit", limit);
  document.getElementById("grid").replaceChildren(...page.rows.map((row) => tile(row, info, { shown, query: p })));
  const last = Math.min(offset + page.rows.length, page.total);
  document.getElementById("count").textContent = page.total
    ? `${offset + 1}–${last} of ${page.total.toLocaleString("en")} matching (${info.num_samples.toLocaleString("en")} in the split)`
    : `no sample matches (${info.num_samples.toLocaleString("en")} in the split)`;
  document.getElementById("prev").disabled = offset === 0;
  document.getElementById("next").disabled = last >= page.total;
  if (offset) p.set("offset", offset);
  history.replaceState(null, "", `/?${p}`); // "/": also where /find said no such key
  document.body.dataset.loaded = String(filters.asked); // the request just shown
  document.body.dataset.loadedMs = String(Math.round(performance.now()));
}

document.getElementById("prev").addEventListener("click", () => { offset = Math.max(0, offset - limit); load(); });
document.getElementById("next").addEventListener("click", () => { offset += limit; load(); });
load();

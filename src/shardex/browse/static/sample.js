import { getJSON, info, splitParams, tile } from "./common.js";

const article = document.querySelector("article.sample");
const index = article.dataset.index;
const snippet = document.getElementById("snippet");
document.getElementById("copy").addEventListener("click", async (event) => {
  try {
    await navigator.clipboard.writeText(snippet.textContent);
    event.target.textContent = "copied";
  } catch {
    const range = document.createRange(); // no clipboard permission: select it for Ctrl-C
    range.selectNodeContents(snippet);
    getSelection().removeAllRanges();
    getSelection().addRange(range);
  }
});

// The image fits the page (small images are enlarged); the button toggles its own size.
const figure = document.getElementById("figure");
document.getElementById("zoom")?.addEventListener("click", (event) => {
  const native = figure.classList.toggle("native");
  event.target.textContent = native ? "fit to page" : "native size";
});

// ← and → go to the previous and next sample of the grid the page was opened from.
addEventListener("keydown", (event) => {
  if (event.altKey || event.ctrlKey || event.metaKey || event.shiftKey) return;
  if (event.target.closest?.("input, select, textarea")) return; // typing there
  const link = { ArrowLeft: "prev", ArrowRight: "next" }[event.key];
  const href = link && document.getElementById(link)?.href;
  if (href) location.assign(href);
});

const similar = document.getElementById("similar");
if (similar) {
  const status = document.getElementById("similar-status");
    try {
    const started = performance.now();
    const found = await getJSON(`/api/similar/${index}?${splitParams({ k: 12 })}`);
    similar.replaceChildren(...found.rows.map((row) => tile(row, info, { cosine: row.score })));
    status.textContent = `nearest by cosine similarity of ${found.column} (${Math.round(performance.now() - started)} ms)`;
  } catch (error) {
    status.textContent = error.message;
  }
}

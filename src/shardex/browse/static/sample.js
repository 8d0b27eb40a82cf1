import { getJSON, info, tile } from "./common.js";

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

const similar = document.getElementById("similar");
if (similar) {
  const status = document.getElementById("similar-status");
    try {
    const started = performance.now();
    const found = await getJSON(`/api/similar/${index}?k=12`);
    similar.replaceChildren(...found.rows.map((row) => tile(row, info)));
    status.textContent = `nearest by cosine similarity of ${found.column} (${Math.round(performance.now() - started)} ms)`;
  } catch (error) {
    status.textContent = error.message;
  }
}

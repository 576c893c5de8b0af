// gpucluster dashboard: live refresh of the server-rendered parts, a run's logs as server-sent
// events, ticking ages and accrued costs, and the confirmation before `down`. No library.
"use strict";

const MAX_LOG_LINES = 5000; // per node pane; the full log stays in the run's node-N.log

function refresher(el) {
  const every = Number(el.dataset.every || 0);
  if (!every) return;
  const timer = setInterval(async () => {
    try {
      const resp = await fetch(el.dataset.refresh, {credentials: "same-origin"});
      if (!resp.ok) return;
      el.innerHTML = await resp.text();
      const facts = el.querySelector("[data-live]");
      if (facts && facts.dataset.live === "0") clearInterval(timer); // the run is over: this was its last state
    } catch (e) { /* the server is gone or busy: try again at the next tick */ }
  }, every * 1000);
}

function followLogs(section) {
  const state = document.getElementById("logs-state");
  const source = new EventSource(section.dataset.stream);
  const pane = (node) => {
    let pre = document.getElementById("log-" + node);
    if (!pre) {
      const box = document.createElement("div");
      box.className = "pane";
      box.innerHTML = "<h3></h3><pre class='log'></pre>";
      box.querySelector("h3").textContent = "node " + node;
      pre = box.querySelector("pre");
      pre.id = "log-" + node;
      pre.dataset.node = node;
      section.querySelector(".panes").appendChild(box);
    }
    return pre;
  };
  source.addEventListener("open", () => {  // a reconnect replays the logs from their start
    section.querySelectorAll("pre.log").forEach((pre) => { pre.textContent = ""; });
  });
  source.addEventListener("line", (ev) => {
    const line = JSON.parse(ev.data);
    const pre = pane(line.node);
    const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    pre.appendChild(document.createTextNode(line.text + "\n"));
    while (pre.childNodes.length > MAX_LOG_LINES) pre.removeChild(pre.firstChild);
    if (atEnd) pre.scrollTop = pre.scrollHeight;
  });
  source.addEventListener("end", () => {
    source.close();
    if (state) state.textContent = "(the run is over)";
  });
}

function money(v) {
  return "$" + v.toLocaleString("en-US", {minimumFractionDigits: 2, maximumFractionDigits: 2});
}

function age(s) {
  if (s < 60) return s.toFixed(0) + " s";
  const m = Math.floor(s / 60);
  if (m < 60) return m + " min";
  return Math.floor(m / 60) + " h " + String(m % 60).padStart(2, "0") + " min";
}

function tick() {
  const now = Date.now() / 1000;
  document.querySelectorAll(".ticking-cost").forEach((td) => {
    const accrued = parseFloat(td.dataset.accrued), hourly = parseFloat(td.dataset.hourly);
    if (isNaN(accrued)) return;
    const more = isNaN(hourly) ? 0 : hourly * (now - Number(td.dataset.at)) / 3600;
    td.textContent = money(accrued + Math.max(0, more));
  });
  document.querySelectorAll(".ticking-age").forEach((td) => {
    td.textContent = age(Number(td.dataset.age) + Math.max(0, now - Number(td.dataset.at)));
  });
}

document.addEventListener("submit", (ev) => {
  const form = ev.target;
  if (form.dataset.confirm && !window.confirm(form.dataset.confirm)) ev.preventDefault();
});

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("[data-refresh]").forEach(refresher);
  const logs = document.querySelector("section[data-stream]");
  if (logs) followLogs(logs);
  tick();
  setInterval(tick, 1000);
});

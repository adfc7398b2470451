// The dashboard's only script: refreshes the page's #content every few seconds,
// with a pause button and an interval kept in localStorage ("0" turns it off), and
// a "select all" box for the Failed page. Hand-written, no build step; the page
// works without it (every link and form is plain HTML).
"use strict";

(() => {
  const SECONDS_KEY = "jobctl.refresh.seconds";
  const PAUSED_KEY = "jobctl.refresh.paused";
  const toggle = document.getElementById("refresh-toggle");
  const select = document.getElementById("refresh-interval");
  const status = document.getElementById("refresh-status");
  const live = document.getElementById("live");
  const content = () => document.getElementById("content");

  // Counters the tests read: timer ticks, and refreshes actually fetched.
  let ticks = 0;
  let refreshes = 0;
  let timer = null;
  let busy = false;

  function storedSeconds() {
    const fallback = Number(document.documentElement.dataset.refreshDefault || 5);
    const stored = localStorage.getItem(SECONDS_KEY);
    const seconds = stored === null ? fallback : Number(stored);
    return Number.isFinite(seconds) && seconds >= 0 ? seconds : fallback;
  }

  let seconds = storedSeconds();
  let paused = localStorage.getItem(PAUSED_KEY) === "1";

  function say(text, state) {
    if (status) status.textContent = text;
    if (live) live.dataset.state = state;
  }

  function show() {
    if (!toggle) return;
    // "updates", not a bare "Pause": the overview has Pause buttons for queues too.
    toggle.textContent = paused ? "Resume updates" : "Pause updates";
    toggle.setAttribute("aria-pressed", paused ? "true" : "false");
    if (select) select.value = String(seconds);
    if (seconds === 0) say("auto-refresh off", "off");
    else if (paused) say("updates paused", "paused");
    else say("live", "live");
  }

  // A person ticking boxes or typing in a filter would lose it to a refresh.
  function editing() {
    const main = content();
    if (!main) return false;
    if (main.querySelector("input[type=checkbox]:checked")) return true;
    // an open edit form keeps what was typed in it, focused or not
    if (main.querySelector("details.edit[open]")) return true;
    const active = document.activeElement;
    return Boolean(active && main.contains(active) && active.matches("input, select, textarea"));
  }

  async function refresh() {
    busy = true;
    try {
      const response = await fetch(location.href, {
        headers: { "X-Dashboard-Refresh": "1" },
        credentials: "same-origin",
        cache: "no-store",
      });
      if (response.redirected) {
        // Signed out meanwhile: show the sign-in page.
        location.assign(response.url);
        return;
      }
      if (!response.ok) {
        say(`refresh failed (${response.status}); retrying`, "error");
        return;
      }
      const page = new DOMParser().parseFromString(await response.text(), "text/html");
      const fresh = page.getElementById("content");
      const current = content();
      if (!fresh || !current || editing()) return;
      current.replaceWith(document.adoptNode(fresh));
      document.title = page.title;
      refreshes += 1;
      document.body.dataset.refreshes = String(refreshes);
      wire();
      // Paused or turned off while this one was on its way: say that, not "updated".
      if (seconds === 0 || paused) show();
      else say(`updated ${new Date().toLocaleTimeString()}`, "live");
    } catch (error) {
      say("refresh failed (server unreachable); retrying", "error");
    } finally {
      busy = false;
    }
  }

  async function tick() {
    ticks += 1;
    document.body.dataset.ticks = String(ticks);
    if (!paused && !busy && !content().hasAttribute("data-static")) {
      if (editing()) say("holding while you edit", "paused");
      else await refresh();
    }
    schedule();
  }

  function schedule() {
    clearTimeout(timer);
    timer = seconds > 0 ? setTimeout(tick, seconds * 1000) : null;
  }

  // The Failed page: a box that ticks every row, and a count of the ticked ones.
  function wire() {
    const all = document.getElementById("select-all");
    const count = document.getElementById("selected-count");
    const boxes = () => document.querySelectorAll("input[type=checkbox][name=job]");
    const recount = () => {
      const n = [...boxes()].filter((b) => b.checked).length;
      if (count) count.textContent = n ? `${n} selected` : "";
    };
    if (all) {
      all.addEventListener("change", () => {
        boxes().forEach((b) => {
          b.checked = all.checked;
        });
        recount();
      });
    }
    boxes().forEach((b) => b.addEventListener("change", recount));
    recount();
  }

  if (toggle) {
    toggle.addEventListener("click", () => {
      paused = !paused;
      localStorage.setItem(PAUSED_KEY, paused ? "1" : "0");
      show();
    });
  }
  if (select) {
    select.addEventListener("change", () => {
      seconds = Number(select.value);
      localStorage.setItem(SECONDS_KEY, String(seconds));
      show();
      schedule();
    });
  }
  wire();
  if (toggle) {
    show();
    schedule();
  }
})();

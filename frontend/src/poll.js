// Polling that stops when the page that started it goes away, and pauses in hidden tabs.

// How often a page asks again for what may have changed elsewhere (counts, status).
const EVERY_MS = 1500;

export function poll(fn, everyMs = EVERY_MS) {
  let stopped = false;
  let timer = null;
  const tick = async () => {
    if (stopped) return;
    if (!document.hidden) {
      try {
        await fn();
      } catch {
        // the next tick tries again; the page shows its own errors
      }
    }
    if (!stopped) timer = setTimeout(tick, everyMs);
  };
  timer = setTimeout(tick, everyMs);
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

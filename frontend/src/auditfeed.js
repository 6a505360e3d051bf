// A tool's audit rows, newest first, read a little at a time. The audit lists oldest first:
// the feed pages through it once, then keeps the cursor of the last full page, so a refresh
// reads only what is new (usually one request). It keeps the newest KEEP rows. Ids are opaque
// (they say nothing of order): the order is the one the pages came in, which a Map keeps.

import { api, q } from "./api.js";
import { paged } from "./limits.js";

const KEEP = 200;
const MAX_PAGES = 100; // one refresh reads at most this many pages

export function auditFeed(toolId, limits) {
  let cursor = null;
  let rows = new Map();
  return async function read() {
    let next = cursor;
    for (let i = 0; i < MAX_PAGES; i += 1) {
      const path = paged(`/v1/audit?tool_id=${q(toolId)}`, limits);
      const page = await api("GET", next ? `${path}&cursor=${q(next)}` : path);
      for (const r of page.data) rows.set(r.id, r);
      if (!page.next_cursor) break;
      next = page.next_cursor;
      cursor = next;
    }
    const kept = [...rows.values()].slice(-KEEP);
    rows = new Map(kept.map((r) => [r.id, r]));
    return kept.reverse();
  };
}

// What a tool returns is hostile: markdown is rendered without raw HTML and then sanitised,
// links and images are kept only for schemes and origins we allow.

import DOMPurify from "dompurify";
import MarkdownIt from "markdown-it";

import { h } from "./dom.js";

const md = new MarkdownIt({ html: false, linkify: false, typographer: false });

const TAGS = [
  "p",
  "br",
  "hr",
  "em",
  "strong",
  "del",
  "s",
  "code",
  "pre",
  "blockquote",
  "ul",
  "ol",
  "li",
  "h1",
  "h2",
  "h3",
  "h4",
  "h5",
  "h6",
  "a",
  "img",
  "table",
  "thead",
  "tbody",
  "tr",
  "th",
  "td",
];

function parse(url) {
  try {
    return new URL(String(url), window.location.origin);
  } catch {
    return null;
  }
}

// Links: the service itself, http(s) and mailto; never javascript:, data:, blob: or the like.
export function safeLink(url) {
  const u = parse(url);
  if (!u || !["https:", "http:", "mailto:"].includes(u.protocol)) return null;
  return u.href;
}

// Images: from the service only (files tools surfaced). An image elsewhere would tell its
// host who looked at a result and when (a tracking pixel); the page's policy refuses it too.
export function safeImage(url) {
  const u = parse(url);
  if (!u) return null;
  if (u.origin === window.location.origin) return u.href;
  return null;
}

// An image the view does not load: its alt text, and a link to it when it is http(s), for
// the reader to open (or not).
export function outsideImage(url, alt) {
  const href = safeLink(url);
  const text = `[image not shown: ${alt}]`;
  if (!href || href.startsWith("mailto:")) return h("span", { text });
  return h(
    "span",
    {},
    `${text} `,
    h("a", { href, rel: "noopener noreferrer nofollow", target: "_blank", text: "open image" }),
  );
}

export function markdown(text) {
  const html = md.render(String(text ?? ""));
  const frag = DOMPurify.sanitize(html, {
    ALLOWED_TAGS: TAGS,
    ALLOWED_ATTR: ["href", "src", "alt", "title"],
    ALLOW_DATA_ATTR: false,
    RETURN_DOM_FRAGMENT: true,
  });
  for (const a of frag.querySelectorAll("a")) {
    const href = safeLink(a.getAttribute("href"));
    if (href) {
      a.setAttribute("href", href);
      a.setAttribute("rel", "noopener noreferrer nofollow");
      a.setAttribute("target", "_blank");
    } else a.removeAttribute("href");
  }
  for (const img of frag.querySelectorAll("img")) {
    const src = safeImage(img.getAttribute("src"));
    if (src) {
      img.setAttribute("src", src);
      img.setAttribute("referrerpolicy", "no-referrer");
    } else {
      img.replaceWith(outsideImage(img.getAttribute("src"), img.getAttribute("alt") || ""));
    }
  }
  return h("div", { class: "markdown" }, frag);
}

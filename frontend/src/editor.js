// The code editor: CodeMirror 6 with Python and JavaScript modes, line numbers, and the
// API's validation problems as diagnostics at their line and column.

import { defaultKeymap, history, historyKeymap, indentWithTab } from "@codemirror/commands";
import { javascript } from "@codemirror/lang-javascript";
import { python } from "@codemirror/lang-python";
import { bracketMatching, defaultHighlightStyle, indentOnInput, syntaxHighlighting } from "@codemirror/language";
import { lintGutter, setDiagnostics } from "@codemirror/lint";
import { Compartment, EditorState } from "@codemirror/state";
import {
  drawSelection,
  EditorView,
  highlightActiveLine,
  highlightActiveLineGutter,
  keymap,
  lineNumbers,
} from "@codemirror/view";

// The nonce of this page's style-src: CodeMirror's one style element must carry it.
const nonce = document.querySelector('meta[name="style-nonce"]')?.getAttribute("content") || "";

const modes = { python: () => python(), javascript: () => javascript() };

export function createEditor(parent, { doc, language, onChange, describedBy }) {
  const lang = new Compartment();
  const view = new EditorView({
    parent,
    state: EditorState.create({
      doc,
      extensions: [
        EditorView.cspNonce.of(nonce),
        lineNumbers(),
        highlightActiveLineGutter(),
        history(),
        drawSelection(),
        indentOnInput(),
        bracketMatching(),
        highlightActiveLine(),
        syntaxHighlighting(defaultHighlightStyle, { fallback: true }),
        lintGutter(),
        // Tab indents; Escape then Tab leaves the editor (CodeMirror's keyboard escape hatch).
        keymap.of([...defaultKeymap, ...historyKeymap, indentWithTab]),
        lang.of((modes[language] || modes.python)()),
        EditorView.contentAttributes.of({
          "aria-label": "Code",
          ...(describedBy ? { "aria-describedby": describedBy } : {}),
        }),
        EditorView.updateListener.of((u) => {
          if (u.docChanged && onChange) onChange();
        }),
      ],
    }),
  });
  return {
    view,
    get value() {
      return view.state.doc.toString();
    },
    set value(text) {
      view.dispatch({ changes: { from: 0, to: view.state.doc.length, insert: text } });
    },
    setLanguage(name) {
      view.dispatch({ effects: lang.reconfigure((modes[name] || modes.python)()) });
    },
    // problems: [{message, line?, column?}] from the API (1-based line and column).
    mark(problems) {
      const doc = view.state.doc;
      const diagnostics = problems.map((p) => {
        const line = doc.line(Math.min(Math.max(Number(p.line) || 1, 1), doc.lines));
        const col = Math.min(Math.max((Number(p.column) || 1) - 1, 0), line.length);
        const from = line.from + col;
        const to = Math.min(line.to, from + 1) > from ? from + 1 : Math.max(line.to, from);
        return { from, to: Math.max(to, from), severity: "error", message: String(p.message) };
      });
      view.dispatch(setDiagnostics(view.state, diagnostics));
    },
    focus() {
      view.focus();
    },
  };
}

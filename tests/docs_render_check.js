// Measures a built page in the browser for tests/test_docs.py (test_rendered_pages).
// tests/test_docs.py appends this script to a copy of the page with THEME set, loads that copy in
// an iframe of the width under test, and reads the JSON the frame posts back (written into the
// outer page's #render-check) from chromium's --dump-dom. Everything is measured from
// computed styles and layout boxes, so it checks what a reader sees, not what the CSS says.
(function () {
  "use strict";

  // Text that this project styles itself (docs/_static/custom.css); furo's own text is furo's job.
  const CUSTOM_TEXT = [
    ".admonition.invariant > .admonition-title",
    "td.outcome-pass .outcome", "td.outcome-fail .outcome", "td.outcome-skip .outcome",
    "td.outcome-xfail .outcome", ".outcome-detail", ".invariant-tests code", "table.test-matrix code",
    "table.invariant-table code", ".stamp-note", ".stamp-note code", ".scroll-hint",
  ];
  const MIN_CONTRAST = 4.5;
  const MIN_DIAGRAM_TEXT_PX = 9;
  // The charts' smallest text is matplotlib's 8 pt at 120 dpi, 13 px: at 70 % it is still 9 px.
  const MIN_IMAGE_SCALE = 0.7;

  function rgba(text) {
    const m = /^rgba?\(([\d.]+),? ([\d.]+),? ([\d.]+)(?:,? \/? ?([\d.]+))?\)$/.exec(text.trim());
    if (!m) return null;
    return [+m[1], +m[2], +m[3], m[4] === undefined ? 1 : +m[4]];
  }

  function over(top, bottom) { // composite top over an opaque bottom
    const a = top[3];
    return [0, 1, 2].map(i => top[i] * a + bottom[i] * (1 - a)).concat([1]);
  }

  function background(el) {
    // The colour behind el: its own and its ancestors' backgrounds, composited down to white.
    const layers = [];
    for (let node = el; node && node.nodeType === 1; node = node.parentElement) {
      const c = rgba(getComputedStyle(node).backgroundColor);
      if (c === null) return null;
      if (c[3] > 0) layers.push(c);
      if (c[3] >= 1) break;
    }
    let colour = [255, 255, 255, 1];
    for (let i = layers.length - 1; i >= 0; i--) colour = over(layers[i], colour);
    return colour;
  }

  function luminance(c) {
    const lin = c.slice(0, 3).map(v => {
      v /= 255;
      return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4);
    });
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2];
  }

  function contrast(a, b) {
    const la = luminance(a), lb = luminance(b);
    return (Math.max(la, lb) + 0.05) / (Math.min(la, lb) + 0.05);
  }

  function describe(el) {
    const text = (el.textContent || "").trim().replace(/\s+/g, " ").slice(0, 50);
    return el.tagName.toLowerCase() + (el.className ? "." + String(el.className).split(" ").join(".") : "") +
      (text ? ` "${text}"` : "");
  }

  function scroller(el, column) {
    // The nearest ancestor inside the column that scrolls horizontally, or null.
    for (let node = el.parentElement; node && node !== column; node = node.parentElement) {
      const ox = getComputedStyle(node).overflowX;
      if (ox === "auto" || ox === "scroll") return node;
    }
    return null;
  }

  function rightCue(box) {
    // The cue that there is more to the right, as the reader sees it: a .scroll-cue element at the
    // box's right edge, drawn (size, opacity, visibility) and painted above the box's content. The
    // paint order is the browser's own: with the cue made hit-testable for a moment,
    // elementFromPoint at its centre must return the cue, not a table cell or a diagram over it.
    // (A gradient background on the box itself is painted under its content: an opaque cell or a
    // diagram's white background hides it.)
    const b = box.getBoundingClientRect();
    const frame = box.parentElement;
    const cues = frame ? [...frame.querySelectorAll(":scope > .scroll-cue-right")] : [];
    for (const cue of cues) {
      const r = cue.getBoundingClientRect();
      const style = getComputedStyle(cue);
      if (r.width < 4 || r.height < 16 || style.visibility !== "visible" || +style.opacity < 0.5) continue;
      if (Math.abs(r.right - b.right) > 2 || r.top > b.top + 1 || r.bottom < b.bottom - 1) continue;
      // elementFromPoint sees only the viewport: bring the cue's top into it first
      cue.scrollIntoView({block: "start", inline: "nearest", behavior: "instant"});  // furo scrolls smoothly
      const seen = cue.getBoundingClientRect();
      const saved = cue.style.pointerEvents;
      cue.style.pointerEvents = "auto";
      const top = document.elementFromPoint(seen.left + seen.width / 2, seen.top + Math.min(seen.height / 2, 200));
      cue.style.pointerEvents = saved;
      if (top === cue) return true;
    }
    return false;
  }

  function measure() {
    document.body.dataset.theme = THEME; // again: furo's own script sets it from localStorage
    void document.body.offsetHeight;
    const out = {theme: document.body.dataset.theme, width: window.innerWidth, problems: [], counts: {}};
    const column = document.querySelector("article[role=main]");
    const colRect = column.getBoundingClientRect();
    out.column = Math.round(colRect.width);

    // 1. The page itself never scrolls sideways.
    const pageWidth = document.documentElement.scrollWidth;
    if (pageWidth > window.innerWidth + 1)
      out.problems.push(`the page is ${pageWidth} px wide in a ${window.innerWidth} px window`);

    // 2. Tables and figures fit the column, or sit in a scroll box with a visible cue.
    let wide = 0;
    for (const el of column.querySelectorAll("table, img, object, figure, svg")) {
      if (el.closest("svg") && el.tagName.toLowerCase() !== "svg") continue;
      const r = el.getBoundingClientRect();
      if (r.width === 0) continue;
      if (r.width <= colRect.width + 1 && r.left >= colRect.left - 1) continue;
      wide++;
      const box = scroller(el, column);
      if (!box) {
        out.problems.push(`${describe(el)} is ${Math.round(r.width)} px wide in a ${Math.round(colRect.width)} px column, with no scroll box`);
        continue;
      }
      const b = box.getBoundingClientRect();
      if (b.width > colRect.width + 1)
        out.problems.push(`the scroll box of ${describe(el)} is itself wider than the column`);
      // At its initial position the box hides what is past its right edge: that needs a cue.
      if (box.scrollWidth > box.clientWidth + 1 && box.scrollLeft === 0 && !rightCue(box))
        out.problems.push(`${describe(el)} (${Math.round(r.width)} px) scrolls in a ${Math.round(b.width)} px box without a visible cue`);
    }
    out.counts.wide = wide;
    window.scrollTo({top: 0, left: 0, behavior: "instant"});  // rightCue scrolled the page to each cue

    // 2a. A test matrix shows its results without scrolling: every outcome column (the patched
    // tree's above all) lies inside the visible part of the table's box.
    for (const table of column.querySelectorAll("table.test-matrix")) {
      const box = scroller(table, column) || column;
      const visible = box.getBoundingClientRect();
      for (const th of table.querySelectorAll("thead th.matrix-result")) {
        const r = th.getBoundingClientRect();
        if (r.right > Math.min(visible.right, colRect.right) + 1 || r.left < visible.left - 1)
          out.problems.push(`test matrix: the result column "${th.textContent.trim()}" is cut off ` +
            `(${Math.round(r.left)}-${Math.round(r.right)} px, visible ${Math.round(visible.left)}-${Math.round(Math.min(visible.right, colRect.right))} px)`);
      }
      if (!table.querySelector("thead th.matrix-result"))
        out.problems.push("test matrix: no result column is marked (th.matrix-result)");
    }

    // 2c. A figure's caption belongs to its own figure: it sits closer to its figure's content
    // above it than to whatever follows the figure (another figure, whose caption it must not
    // look like a title of).
    for (const fig of column.querySelectorAll("figure")) {
      const caption = fig.querySelector(":scope > figcaption");
      const next = fig.nextElementSibling;
      if (!caption || !next) continue;
      const media = [...fig.children].filter(c => c !== caption && c.getBoundingClientRect().height > 0);
      if (!media.length) continue;
      const ownGap = caption.getBoundingClientRect().top - Math.max(...media.map(m => m.getBoundingClientRect().bottom));
      const nextGap = next.getBoundingClientRect().top - caption.getBoundingClientRect().bottom;
      if (nextGap < 2 * Math.max(ownGap, 4))
        out.problems.push(`${describe(caption)}: ${Math.round(nextGap)} px from the next element, ` +
          `${Math.round(ownGap)} px from its own figure: it reads as the next one's title`);
    }

    // 2d. Charts (images in figures) are drawn at no less than MIN_IMAGE_SCALE of their size, so
    // that their legend and tick labels stay readable: a narrower column scrolls them instead.
    let images = 0;
    for (const img of column.querySelectorAll("figure img")) {
      if (!img.naturalWidth) {
        out.problems.push(`${img.getAttribute("src")}: image not loaded`);
        continue;
      }
      images++;
      const scale = img.getBoundingClientRect().width / img.naturalWidth;
      if (scale < MIN_IMAGE_SCALE)
        out.problems.push(`${img.getAttribute("src")}: drawn at ${Math.round(scale * 100)} % of its size ` +
          `(${Math.round(img.getBoundingClientRect().width)} of ${img.naturalWidth} px): its labels are unreadable`);
    }
    out.counts.images = images;

    // 2b. No table starts with a blank header row (a Markdown key/value table's `| | |`).
    for (const head of column.querySelectorAll("thead")) {
      if (!head.textContent.trim())
        out.problems.push(`${describe(head.closest("table"))} starts with an empty header row`);
    }

    // 3. Contrast of the text this project styles.
    let checked = 0;
    for (const selector of CUSTOM_TEXT) {
      for (const el of document.querySelectorAll(selector)) {
        if (!(el.textContent || "").trim() || el.getBoundingClientRect().height === 0) continue;
        const fg = rgba(getComputedStyle(el).color);
        const bg = background(el);
        if (fg === null || bg === null) {
          out.problems.push(`${selector}: cannot read colours (${getComputedStyle(el).color})`);
          continue;
        }
        checked++;
        const ratio = contrast(over(fg, bg), bg);
        if (ratio < MIN_CONTRAST) {
          out.problems.push(`${selector} ${describe(el)}: contrast ${ratio.toFixed(2)}:1 < ${MIN_CONTRAST}:1` +
            ` (rgb ${fg.slice(0, 3)} on rgb ${bg.slice(0, 3).map(Math.round)})`);
          break; // one example per selector is enough
        }
      }
    }
    out.counts.contrast = checked;

    // 4. Diagram labels stay readable at the size the diagram is drawn.
    let diagrams = 0;
    for (const obj of column.querySelectorAll("object.graphviz")) {
      const doc = obj.contentDocument;
      const svg = doc && doc.querySelector("svg");
      if (!svg) {
        out.problems.push(`${obj.getAttribute("data")}: SVG not loaded`);
        continue;
      }
      diagrams++;
      const view = svg.viewBox.baseVal;
      const scale = obj.getBoundingClientRect().width / view.width;
      const sizes = [...svg.querySelectorAll("text")].map(t => parseFloat(t.getAttribute("font-size") || "14"));
      const smallest = Math.min(...sizes) * scale;
      if (smallest < MIN_DIAGRAM_TEXT_PX)
        out.problems.push(`${obj.getAttribute("data")}: labels drawn at ${smallest.toFixed(1)} px (diagram ${Math.round(view.width)} pt scaled to ${Math.round(obj.getBoundingClientRect().width)} px)`);
    }
    out.counts.diagrams = diagrams;

    // The page is measured inside an iframe of the width under test (headless Chromium's window
    // is never narrower than 500 px); the page holding the frame copies this element out.
    const pre = document.createElement("pre");
    pre.id = "render-result";
    pre.textContent = JSON.stringify(out);
    document.body.appendChild(pre);
  }

  document.body.dataset.theme = THEME;
  window.addEventListener("load", () => setTimeout(measure, 0));
})();

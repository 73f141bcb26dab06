// Scroll cues for wide tables, diagrams and charts: a shadow drawn over the right (or left) edge of
// a box that scrolls sideways, while there is more to see on that side.
//
// A gradient background on the scrolling box itself is painted under its content, so an opaque
// table cell or a diagram's white background hides it. The cue is therefore an element of its
// own, laid over the box's edge: each scrolling box is wrapped in a frame (position: relative)
// that holds the box and its two cues (docs/_static/custom.css draws them).
(function () {
  "use strict";

  const BOXES = ".table-wrapper.container, div.graphviz, div.chart-scroll";

  function update(frame, box) {
    const more = box.scrollWidth - box.clientWidth;
    frame.classList.toggle("more-right", more > 1 && box.scrollLeft < more - 1);
    frame.classList.toggle("more-left", more > 1 && box.scrollLeft > 1);
  }

  function frameOf(box) {
    if (box.parentElement.classList.contains("scroll-frame")) return box.parentElement;
    const frame = document.createElement("div");
    frame.className = "scroll-frame";
    box.parentElement.insertBefore(frame, box);
    frame.appendChild(box);
    for (const side of ["left", "right"]) {
      const cue = document.createElement("div");
      cue.className = `scroll-cue scroll-cue-${side}`;
      cue.setAttribute("aria-hidden", "true");
      frame.appendChild(cue);
    }
    box.addEventListener("scroll", () => update(frame, box), {passive: true});
    return frame;
  }

  function all() {
    for (const box of document.querySelectorAll(BOXES)) update(frameOf(box), box);
  }

  // Images and diagrams change a box's width when they load, and the window may change size.
  window.addEventListener("load", all);
  window.addEventListener("resize", all);
  document.addEventListener("DOMContentLoaded", all);
})();

// Draws each interactive figure of a page (vitlab.explorer) in place of its still image.
// The figure's Vega-Lite spec sits in a <script type="application/json"> beside the still;
// Vega, Vega-Lite and vega-embed are the book's own copies (book/_ext/vega_figures.py).
// The views are kept in window.vitlabViews (the browser tests read their state there).
"use strict";
(function () {
  // The labels of the controls in the translated editions (the page's <html lang>).
  const WORDS = {
    ko: {"layer ": "층 ", "head ": "헤드 ", "mean": "평균", "query patch (-1: [cls]) ": "질의 패치 (-1: [cls]) ",
         "step ": "단계 ", "query patch": "질의 패치", "its attention over the keys": "키에 대한 어텐션"},
    zh: {"layer ": "层 ", "head ": "头 ", "mean": "平均", "query patch (-1: [cls]) ": "查询图块 (-1: [cls]) ",
         "step ": "步骤 ", "query patch": "查询图块", "its attention over the keys": "对键的注意力"},
  };
  const words = WORDS[(document.documentElement.lang || "en").slice(0, 2)] || {};
  const say = (text) => words[text] || text;

  function translate(spec) {
    // titles and the names and option labels of the bound controls
    if (Array.isArray(spec)) return spec.map(translate);
    if (spec === null || typeof spec !== "object") return spec;
    const out = {};
    for (const [key, value] of Object.entries(spec)) {
      if (key === "values") out[key] = value;  // data: left as it is
      else if ((key === "title" || key === "name") && typeof value === "string") out[key] = say(value);
      else if (key === "labels" && Array.isArray(value)) out[key] = value.map(say);
      else out[key] = translate(value);
    }
    return out;
  }

  window.vitlabViews = [];
  document.querySelectorAll("div.vitlab-vega").forEach((box, index) => {
    const data = box.querySelector('script[type="application/json"]');
    const still = box.querySelector("img");
    if (!data || !window.vegaEmbed) return;
    const target = document.createElement("div");
    target.className = "vitlab-vega-live";
    box.appendChild(target);
    const spec = translate(JSON.parse(data.textContent));
    // logLevel Error: vega 6.3.0's bundle calls itself 5.33.1, and vega-embed warns about it.
    window.vitlabViews[index] = vegaEmbed(target, spec, {actions: false, renderer: "svg", logLevel: vega.Error}).then((result) => {
      if (still) still.remove();
      return result.view;
    });
  });
})();

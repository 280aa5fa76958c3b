// Draws each interactive figure of a page (vitlab.explorer) in place of its still image.
// The figure's Vega-Lite spec sits in a <script type="application/json"> beside the still;
// Vega, Vega-Lite and vega-embed are the book's own copies (book/_ext/vega_figures.py), and
// this file is deferred after them, so it runs once the page is parsed.
// The views are kept in window.vitlabViews, as promises (the browser tests read their state).
"use strict";
(function () {
  // The English words of the figures' titles and controls (vitlab.explorer), per language
  // (the page's <html lang>). A menu label "blocks.0.attn · self-attention · after mixing"
  // is translated part by part; a part not listed (a module path, a number) stays as it is.
  const WORDS = {
    ko: {
      "layer": "층", "head": "헤드", "mean": "평균",
      "query patch": "쿼리 패치", "its attention over the keys": "키에 대한 어텐션", "step": "단계",
      "previous step": "이전 단계", "next step": "다음 단계",
      "self-attention": "셀프 어텐션", "class-attention": "클래스 어텐션", "cross-attention": "크로스 어텐션",
      "re-attention": "재어텐션", "talking heads": "토킹 헤드", "before mixing": "섞기 전",
      "after mixing": "섞은 뒤", "rollout": "롤아웃", "input": "입력", "attention bias": "어텐션 바이어스",
      "self": "셀프", "class": "클래스", "cross": "크로스", "mixed": "섞임",
    },
    zh: {
      "layer": "层", "head": "头", "mean": "平均",
      "query patch": "查询图像块", "its attention over the keys": "对键的注意力", "step": "步骤",
      "previous step": "上一步", "next step": "下一步",
      "self-attention": "自注意力", "class-attention": "类注意力", "cross-attention": "交叉注意力",
      "re-attention": "重注意力", "talking heads": "talking heads", "before mixing": "混合前",
      "after mixing": "混合后", "rollout": "展开", "input": "输入", "attention bias": "注意力偏置",
      "self": "自", "class": "类", "cross": "交叉", "mixed": "混合",
    },
  };
  const words = WORDS[(document.documentElement.lang || "en").slice(0, 2).toLowerCase()] || {};
  const word = (part) => {
    const core = part.trim();
    return core in words ? part.replace(core, words[core]) : part;
  };
  // "blocks.1.attn · self-attention", "blocks.1.attn (self, after mixing)", "layer "
  const say = (text) => text.split(/( · |, |\(|\))/).map(word).join("");

  function translate(spec) {
    // titles, and the names and option labels of the bound controls
    if (Array.isArray(spec)) return spec.map(translate);
    if (spec === null || typeof spec !== "object") return spec;
    const out = {};
    for (const [key, value] of Object.entries(spec)) {
      if (key === "values" || key === "datasets" || key === "description") out[key] = value;  // data; alt text (done by the build)
      else if (key === "title" && typeof value === "string") out[key] = say(value);
      else if (key === "name" && typeof value === "string" && "input" in spec) out[key] = say(value);  // a binding's label
      else if (key === "labels" && Array.isArray(value)) out[key] = value.map(say);
      else out[key] = translate(value);
    }
    return out;
  }

  // The shape stepper's buttons: each moves its "step" slider by one, as a drag or an arrow key
  // on the slider does (the same input event, so Vega's own binding updates the chart).
  function addStepButtons(target) {
    const slider = target.querySelector('.vega-bind input[type="range"][name^="step"]');
    if (!slider) return;
    const move = (by) => {
      const value = Math.min(Math.max(Number(slider.value) + by, Number(slider.min)), Number(slider.max));
      slider.value = String(value);
      slider.dispatchEvent(new Event("input", {bubbles: true}));
    };
    const row = document.createElement("div");
    row.className = "vitlab-step-buttons";
    for (const [text, label, by] of [["◀", "previous step", -1], ["▶", "next step", 1]]) {
      const button = document.createElement("button");
      button.type = "button";
      button.textContent = text;
      button.title = word(label);
      button.setAttribute("aria-label", word(label));
      button.addEventListener("click", () => move(by));
      row.appendChild(button);
    }
    slider.closest(".vega-bind").appendChild(row);
  }

  window.vitlabViews = [];
  document.querySelectorAll("div.vitlab-vega").forEach((box, index) => {
    const data = box.querySelector('script[type="application/json"]');
    const still = box.querySelector("img");
    if (!data || !window.vegaEmbed) return;  // the still stays
    const target = document.createElement("div");
    target.className = "vitlab-vega-live";
    box.appendChild(target);
    // Out of the page at once (not when the chart is drawn), so the page a reader or a test
    // sees after loading has the live chart only; it comes back if drawing fails.
    if (still) still.remove();
    const spec = translate(JSON.parse(data.textContent));
    // logLevel Error: the specs are Vega-Lite 5 (what JupyterLab draws) and vega-embed warns that
    // this is 6; vega 6.3.0's bundle also calls itself 5.33.1.
    const options = {actions: false, renderer: "svg", logLevel: vega.Error};
    window.vitlabViews[index] = vegaEmbed(target, spec, options).then(
      (result) => {
        addStepButtons(target);
        return result.view;
      },
      (error) => {
        target.remove();
        if (still) box.prepend(still);
        throw error;
      },
    );
  });
})();

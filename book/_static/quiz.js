/* ViT Lab: the chapter quizzes (book/_ext/quiz.py writes their HTML).
 *
 * Each question is a radio group and a Check button. Check says, in a live region, whether
 * the chosen option is right and shows that option's explanation, copied from the quiz's
 * "All answers explained" list (which also serves readers without JavaScript). The reader
 * may try again as often as they like. No request, no storage.
 */
"use strict";
(() => {
    const setUp = (question, labels) => {
        const button = question.querySelector(".vl-quiz-check");
        const feedback = question.querySelector(".vl-quiz-feedback");
        const answer = question.dataset.answer;
        button.hidden = false;
        question.addEventListener("change", () => {
            // a new choice clears the verdict on the old one
            question.querySelectorAll(".vl-quiz-option").forEach((o) => o.classList.remove("is-right", "is-wrong"));
        });
        button.addEventListener("click", () => {
            const chosen = question.querySelector("input[type=radio]:checked");
            feedback.replaceChildren();
            feedback.className = "vl-quiz-feedback";
            if (!chosen) {
                feedback.textContent = labels.pick;
                return;
            }
            const right = chosen.value === answer;
            const verdict = document.createElement("strong");
            verdict.textContent = right ? labels.right : labels.wrong;
            const why = question.querySelector(`.vl-quiz-explanation[data-option="${chosen.value}"] .vl-quiz-text`);
            const explanation = document.createElement("span");
            explanation.innerHTML = why ? why.innerHTML : "";
            feedback.append(verdict, " ", explanation);
            feedback.classList.add(right ? "is-right" : "is-wrong");
            chosen.closest(".vl-quiz-option").classList.add(right ? "is-right" : "is-wrong");
        });
    };
    const start = () => {
        document.querySelectorAll(".vl-quiz").forEach((quiz) => {
            const labels = {right: quiz.dataset.labelRight, wrong: quiz.dataset.labelWrong, pick: quiz.dataset.labelPick};
            quiz.querySelectorAll(".vl-quiz-question").forEach((q) => setUp(q, labels));
        });
    };
    if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
    else start();
})();

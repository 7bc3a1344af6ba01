// dynask admin: small behaviours shared by every page (no framework, no build step).
"use strict";

// A form with data-confirm asks before it submits (delete, retire).
document.addEventListener("submit", (event) => {
  const form = event.target;
  if (form instanceof HTMLFormElement && form.dataset.confirm && !window.confirm(form.dataset.confirm)) {
    event.preventDefault();
  }
});

// A click on a command copies it.
document.addEventListener("click", (event) => {
  const code = event.target.closest ? event.target.closest("code.copy") : null;
  if (code && navigator.clipboard) {
    navigator.clipboard.writeText(code.textContent.trim()).then(() => {
      code.classList.add("copied");
      setTimeout(() => code.classList.remove("copied"), 1200);
    });
  }
});

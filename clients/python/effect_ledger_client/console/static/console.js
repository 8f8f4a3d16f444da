// Live updates for the approval inbox: the gate's approval feed reaches the page as server-sent
// events, and htmx reloads the inbox's list (hx-trigger="approvals-changed from:body"). A reason
// being typed is never thrown away: the page then offers the changes instead of showing them.
(function () {
  "use strict";

  function typing(inbox) {
    var fields = inbox.querySelectorAll("textarea, input[type=text]");
    for (var i = 0; i < fields.length; i++) {
      if (fields[i].value.trim() !== "") {
        return true;
      }
    }
    return false;
  }

  function refresh() {
    document.getElementById("inbox-notice").hidden = true;
    document.body.dispatchEvent(new CustomEvent("approvals-changed"));
  }

  function showChanges() {
    var fields = document.querySelectorAll("#inbox textarea");
    for (var i = 0; i < fields.length; i++) {
      fields[i].value = "";
    }
    refresh();
  }

  function follow(inbox) {
    if (!window.EventSource) {
      return;
    }
    var source = new EventSource(inbox.getAttribute("data-events"));
    source.addEventListener("approvals", function () {
      document.body.dispatchEvent(new CustomEvent("approvals-changed"));
    });
    document.getElementById("inbox-refresh").addEventListener("click", showChanges);
    // The feed also replays what the page already shows: swap only a list that changed.
    document.body.addEventListener("htmx:beforeSwap", function (event) {
      if (event.detail.target !== inbox) {
        return;
      }
      var current = document.getElementById("inbox-list");
      var found = /data-version="([0-9a-f]+)"/.exec(event.detail.xhr.responseText || "");
      if (current && found && current.getAttribute("data-version") === found[1]) {
        event.detail.shouldSwap = false;
      } else if (typing(inbox)) {
        event.detail.shouldSwap = false;
        document.getElementById("inbox-notice").hidden = false;
      }
    });
    inbox.setAttribute("data-live", "true");
  }

  document.addEventListener("DOMContentLoaded", function () {
    var inbox = document.getElementById("inbox");
    if (inbox && inbox.hasAttribute("data-events")) {
      follow(inbox);
    }
  });
})();

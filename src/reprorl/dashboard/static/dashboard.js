// The dashboard's script: draws charts from JSON this origin serves, follows a run's update stream,
// and asks for replays. Record text is only ever placed as text; HTML it inserts was rendered (and
// escaped) by the server.
"use strict";

(function () {
  const body = document.body;
  const plotConfig = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["sendDataToCloud"] };

  function drawFigures(figures) {
    if (!window.Plotly) return;
    for (const [id, figure] of Object.entries(figures)) {
      const div = document.getElementById(id);
      if (div) window.Plotly.react(div, figure.data || [], figure.layout || {}, plotConfig);
    }
  }

  function setText(id, text) {
    const el = document.getElementById(id);
    if (el) el.textContent = String(text);
  }

  function runPage() {
    const run = body.dataset.run;
    const container = document.getElementById("sections");
    const shown = {};
    let loading = false;
    let again = false;

    function applySnapshot(s) {
      setText("run-steps", s.steps);
      setText("run-evals", s.evals);
      const status = document.getElementById("run-status");
      if (status) {
        status.textContent = s.status;
        status.className = "status status-" + s.status;
      }
    }

    async function loadSections() {
      if (loading) {
        again = true;
        return;
      }
      loading = true;
      try {
        const reply = await fetch("/api/runs/" + encodeURIComponent(run) + "/sections", { credentials: "same-origin" });
        const data = await reply.json();
        if (!reply.ok) throw new Error(data.error || reply.statusText);
        applySnapshot(data);
        if (!container.dataset.loaded) {
          container.textContent = "";
          container.dataset.loaded = "1";
        }
        for (const section of data.sections) {
          const current = document.getElementById("sec-" + section.key);
          if (current && shown[section.key] === section.html) continue;
          const holder = document.createElement("div");
          holder.innerHTML = section.html; // rendered and escaped by the server
          const fresh = holder.firstElementChild;
          if (current) current.replaceWith(fresh);
          else container.appendChild(fresh);
          shown[section.key] = section.html;
        }
        drawFigures(data.figures);
        container.dataset.revision = String(Number(container.dataset.revision || 0) + 1);
      } catch (error) {
        setText("live-note", "Could not load the run's sections: " + error.message);
      } finally {
        loading = false;
        if (again) {
          again = false;
          loadSections();
        }
      }
    }

    loadSections();
    const stream = new EventSource("/api/runs/" + encodeURIComponent(run) + "/stream");
    stream.addEventListener("update", (event) => {
      applySnapshot(JSON.parse(event.data));
      loadSections();
    });
    stream.addEventListener("done", () => {
      stream.close();
      setText("live-note", "The run has ended: this page shows its final records.");
    });
  }

  function comparePage() {
    const data = document.getElementById("figures");
    if (data) drawFigures(JSON.parse(data.textContent));
  }

  function rolloutPage() {
    const button = document.getElementById("replay");
    const out = document.getElementById("replay-result");
    if (!button || !out) return;
    button.addEventListener("click", async () => {
      const mode = document.getElementById("replay-mode").value;
      button.disabled = true;
      out.className = "note";
      out.textContent = "Replaying (" + mode + ")…";
      try {
        const url = "/api/runs/" + encodeURIComponent(button.dataset.run) + "/replay?id=" +
          encodeURIComponent(button.dataset.rollout) + "&mode=" + encodeURIComponent(mode);
        const reply = await fetch(url, { method: "POST", headers: { "X-Reprorl-Request": "1" }, credentials: "same-origin" });
        const report = await reply.json();
        if (!reply.ok) throw new Error(report.error || reply.statusText);
        const agreement = report.compared ? " · tokens agreed " + report.agreed + "/" + report.compared : "";
        if (report.identical) {
          out.className = "good";
          out.textContent = "Identical: " + report.turns + " turns, " + report.tokens + " tokens" + agreement + ".";
        } else {
          const d = report.first_difference;
          out.className = "bad";
          out.textContent = "First difference: " + d.where + (d.turn === null ? "" : " at turn " + d.turn) +
            (d.index === null ? "" : ", token " + d.index) + ": recorded " + d.recorded + ", replayed " + d.replayed + agreement + ".";
        }
        out.dataset.done = "1";
      } catch (error) {
        out.className = "bad";
        out.textContent = "Replay failed: " + error.message;
        out.dataset.done = "1";
      } finally {
        button.disabled = false;
      }
    });
  }

  const pages = { run: runPage, compare: comparePage, rollout: rolloutPage };
  if (pages[body.dataset.page]) pages[body.dataset.page]();
})();

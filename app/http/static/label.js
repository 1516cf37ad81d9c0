// The Label tab (`onepass label STATES.jsonl`): one state at a time, its current answers and sets, the
// right answers given with a click and saved to the server's labels file; beside it each question's fit.
// It uses app.js's helpers ($, el, num, call, showError, ...); as there, text is set as text only.
"use strict";

const POLL_MS = 1000; // how often the tab reads the session while it is open
const QUEUE = 10; // states asked for at a time
const labelling = { queue: [], skipped: new Set(), saved: new Set(), current: null, timer: null, refit: null, open: false };

function showTab() {
  const label = location.hash === "#label";
  $("#ask-view").hidden = label;
  $("#label-view").hidden = !label;
  $("#tab-ask").classList.toggle("current", !label);
  $("#tab-label").classList.toggle("current", label);
  labelling.open = label;
  clearTimeout(labelling.timer);
  if (label) readSession();
}

// --- the session: progress, figures, refits --------------------------------------------------------

async function readSession() {
  clearTimeout(labelling.timer);
  if (!labelling.open) return;
  let reply;
  try {
    reply = await call("GET", "v1/labelling");
  } catch (error) {
    return showUnreachable(error, readSession);
  }
  if (!reply.ok) {
    $("#label-status").textContent = "";
    return showError(reply, reply.status === 404 ? null : readSession);
  }
  const session = reply.data;
  showSession(session);
  const answering = session.answering;
  if (answering?.status === "done") {
    const refit = session.refit ? `${session.refit.id} ${session.refit.status}` : null;
    const refitted = refit !== labelling.refit && session.refit?.status !== "running";
    if (refitted) labelling.refit = refit;
    if (!labelling.current) await nextState(true);
    else if (refitted && refit !== null) await refreshAnswers();
  }
  labelling.timer = setTimeout(readSession, POLL_MS);
}

function showSession(session) {
  const answering = session.answering;
  let status = `${session.states} states, ${session.labelled} labelled · model ${session.model}`;
  if (answering && answering.status === "running") {
    const eta = answering.eta_s == null ? "" : `, about ${Math.ceil(answering.eta_s)} s left`;
    status = `Answering the states: ${answering.done} of ${answering.total}${eta}. ` + status;
  } else if (answering && answering.status !== "done") {
    status = `Answering the states ${answering.status}: ${answering.error || "see the server's log"}`;
  }
  const line = $("#label-status");
  line.textContent = status;
  Object.assign(line.dataset, { labelled: String(session.labelled), answering: answering?.status ?? "" });
  $("#labels-file").textContent = session.labels_file;
  $("#label-figures tbody").replaceChildren(...session.questions.map((q) => figureRow(q, session.coverage)));
  const refit = $("#refit-status");
  const job = session.refit;
  refit.textContent = job === null ? "No refit yet: the fits refit as you save labels." : `Refit ${job.status} (job ${job.id})${session.refit_pending ? "; one more to come for the labels since" : ""}.`;
  refit.dataset.status = job?.status ?? "";
  refit.dataset.id = job?.id ?? "";
}

function figureRow(q, coverage) {
  const cell = (...children) => el("td", null, ...children);
  const number = (value, digits) => (value == null ? cell("–") : Object.assign(cell(num(value, "", digits)), { className: "num" }));
  const fit = q.method ? el("code", null, q.method) : el("span", "hint", q.note);
  const held = q.sets ? `${Math.round(100 * coverage)}%: ${q.sets.coverage.toFixed(2)} held, size ${q.sets.size.toFixed(2)}` : "–";
  const row = el("tr", null, cell(q.name, " ", el("span", "hint", q.type)), cell(String(q.labelled)), cell(fit), number(q.accuracy, 3), cell(held), number(q.mean_set_size, 2));
  row.dataset.question = q.name;
  return row;
}

// --- one state at a time ----------------------------------------------------------------------

// The states skipped are left out by the server: the queue it ranks is capped, and the skipped would
// otherwise fill it once there are enough of them.
function queuePath(count) {
  const skip = labelling.skipped.size ? `&skip=${[...labelling.skipped].join(",")}` : "";
  return `v1/labelling/next?count=${count}${skip}`;
}

// A queue may have left the server before a label saved since: the states saved here are left out of it.
function unsaved(states) {
  return states.filter((s) => !labelling.saved.has(s.state));
}

async function nextState(fresh = false) {
  if (fresh || !labelling.queue.length) {
    const reply = await call("GET", queuePath(QUEUE));
    if (!reply.ok) return showError(reply);
    labelling.queue = unsaved(reply.data.states);
  }
  labelling.current = labelling.queue.shift() ?? null;
  showState(labelling.current);
}

// A refit that ended changes the answers: the states are asked for again, with the fits now. The state
// on screen stays (with what was picked for it), its answers as they are now.
async function refreshAnswers() {
  const reply = await call("GET", queuePath(50));
  if (!reply.ok) return showError(reply);
  const current = labelling.current;
  const now = reply.data.states.find((s) => s.state === current?.state);
  // skipped since it was asked for: the reply may list them
  labelling.queue = unsaved(reply.data.states).filter((s) => s !== now && !labelling.skipped.has(s.state));
  if (!now) return;
  labelling.current = now;
  for (const card of $$("#label-questions .to-label")) {
    const answer = now.answers[card.dataset.qid];
    $(".current", card)?.remove();
    if (answer) $(".choices", card).before(currentAnswer(answer));
  }
  $("#label-state").dataset.refit = labelling.refit;
}

function showState(item) {
  const card = $("#label-state");
  card.hidden = item === null;
  if (item === null) {
    $("#label-status").append(el("span", "done", " Every state is labelled or skipped."));
    return;
  }
  card.dataset.state = String(item.state);
  $("#label-line").textContent = `line ${item.state}`;
  $("#label-text").textContent = textOf(item.text);
  $("#label-images").replaceChildren(...item.images.map((url, i) => el("li", null, Object.assign(el("img"), { src: url, alt: `image ${i + 1}` }))));
  $("#label-questions").replaceChildren(...Object.entries(item.questions).map(([id, q]) => toLabel(id, q, item.answers[id])));
  $("#label-saved").textContent = "";
}

// Each label as the labels file keeps it: true/false, an option name, a level index.
function labelsOf(question) {
  if (question.type === "noul") return [[true, "yes"], [false, "no"]];
  if (question.type === "choice") return Object.keys(question.criteria).map((name) => [name, name]);
  return question.criteria.map((level, i) => [i, `${i} ${textOf(level)}`]);
}

function toLabel(id, question, answer) {
  const card = el("fieldset", "to-label", el("legend", null, el("span", "qid", id), " ", el("span", "type", question.type), " ", textOf(question.instructions)));
  card.dataset.qid = id;
  if (answer) card.append(currentAnswer(answer));
  const choices = labelsOf(question).map(([value, text]) => {
    const input = Object.assign(el("input"), { type: "radio", name: `label-${id}` });
    input.dataset.value = JSON.stringify(value);
    return el("label", null, input, text);
  });
  card.append(el("div", "choices", ...choices));
  return card;
}

function currentAnswer(answer) {
  const line = el("p", "current", "now: ");
  if (answer.type === "noul") line.append("yes ", num(answer.noul, "p"));
  else if (answer.type === "choice") line.append(answer.choice, " ", num(answer.probabilities[answer.choice], "p"));
  else line.append("expected score ", num(answer.score, "p"));
  if (answer.x_set) {
    line.append(" · set at ", `${Math.round(100 * answer.x_set.coverage)}%: `, answerSet(answer.x_set));
  } else {
    line.append(" · no set (no fit yet)");
  }
  if (answer.x_calibration) line.append(" · fit ", el("code", "fit", answer.x_calibration.method));
  if (answer.x_label_mass !== undefined && answer.x_label_mass < LOW_MASS) {
    line.append(el("span", "warning", ` · off format: ${Math.round(answer.x_label_mass * 100)}% of the next token on the labels`));
  }
  line.dataset.answer = JSON.stringify(answer);
  return line;
}

async function save() {
  const item = labelling.current;
  if (!item) return;
  clearError();
  const answers = {};
  for (const card of $$("#label-questions .to-label")) {
    const picked = $("input:checked", card);
    if (picked) answers[card.dataset.qid] = JSON.parse(picked.dataset.value);
  }
  if (!Object.keys(answers).length) return showBox("form", el("strong", null, "Pick the right answer to at least one question, or skip this state."));
  const button = $("#label-save");
  button.disabled = true;
  let reply;
  try {
    reply = await call("POST", "v1/labelling/labels", { state: item.state, answers });
  } catch (error) {
    return showUnreachable(error);
  } finally {
    button.disabled = false;
  }
  if (!reply.ok) return showError(reply);
  labelling.saved.add(item.state);
  const saved = $("#label-saved");
  await nextState();
  saved.textContent = `line ${item.state} saved (${reply.data.labelled} labelled)`;
  saved.dataset.saved = String(reply.data.labelled);
  readSession();
}

function skip() {
  if (!labelling.current) return;
  labelling.skipped.add(labelling.current.state);
  nextState();
}

$("#label-save").addEventListener("click", save);
$("#label-skip").addEventListener("click", skip);
window.addEventListener("hashchange", showTab);
showTab();

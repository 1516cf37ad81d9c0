// The playground: a form that builds one System One request, and its answers drawn as bars.
// Text from the form or the server is only ever set with textContent or as an input's value:
// nothing a user types or a model answers is parsed as HTML.
"use strict";

const KEY_STORAGE = "onepass.apiKey";
const LOW_MASS = 0.5; // below this share of the next-token probability on the labels the model was off format
const TIMING_PARTS = ["prefill", "restore", "decode", "calibrate"];
const SDK_CLASSES = { noul: "Noul", choice: "Choice", score: "Score" };

const $ = (selector, root = document) => root.querySelector(selector);
const $$ = (selector, root = document) => [...root.querySelectorAll(selector)];
const fromTemplate = (id) => document.getElementById(id).content.firstElementChild.cloneNode(true);
const storedKey = () => localStorage.getItem(KEY_STORAGE) || "";
const textOf = (value) => (value == null ? "" : typeof value === "string" ? value : JSON.stringify(value));
const baseUrl = () => new URL(".", location.href).href.replace(/\/$/, "");
// misses: timings by model, state and images; models: /v1/models' entries by name; images: the attached, in order
const session = { completed: 0, misses: new Map(), retryTimer: null, models: new Map(), images: [] };

function el(tag, className, ...children) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  node.append(...children);
  return node;
}

// A number as shown (fixed digits) with its exact value in data-value.
function num(value, className = "", digits = 3) {
  const node = el("span", `num ${className}`.trim(), value.toFixed(digits));
  node.dataset.value = String(value);
  return node;
}

function ms(value) {
  return value >= 100 ? `${Math.round(value).toLocaleString("en")} ms` : `${value.toFixed(1)} ms`;
}

// --- talking to onepass ---------------------------------------------------------------------

async function call(method, path, body) {
  const headers = {};
  if (storedKey()) headers.Authorization = `Bearer ${storedKey()}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await response.text();
  let data = text;
  try {
    data = JSON.parse(text);
  } catch {
    // not JSON: shown as the server wrote it
  }
  const retryAfter = response.headers.get("Retry-After");
  return { ok: response.ok, status: response.status, statusText: response.statusText, retryAfter, data };
}

async function loadModels(keepError = false) {
  clearTimeout(session.retryTimer);
  if (!keepError) clearError();
  $("#key-status").hidden = !storedKey();
  let reply;
  try {
    reply = await call("GET", "v1/models");
  } catch (error) {
    return showUnreachable(error, loadModels);
  }
  if (reply.status === 401) return askForKey(reply);
  if (!reply.ok) return showError(reply, loadModels);
  $("#key-prompt").hidden = true;
  const select = $("#model");
  const previous = select.value;
  const label = (model) => (model.x_model && model.x_model !== model.name ? `${model.name} → ${model.x_model}` : model.name);
  select.replaceChildren(...reply.data.models.map((model) => Object.assign(new Option(label(model), model.name), { title: model.description })));
  if (reply.data.models.some((model) => model.name === previous)) select.value = previous;
  session.models = new Map(reply.data.models.map((model) => [model.name, model]));
  showImageControl();
  $("#ask").disabled = false;
}

function askForKey(reply) {
  showError(reply);
  $("#ask").disabled = true;
  $("#key-prompt").hidden = false;
  $("#key").focus();
}

// --- the form ---------------------------------------------------------------------------------

function addOption(card, name = "", description = "") {
  const row = fromTemplate("option-template");
  $(".name", row).value = name;
  $(".desc", row).value = description;
  $(".options", card).append(row);
}

function addLevel(card, description = "") {
  const row = fromTemplate("level-template");
  $(".desc", row).value = description;
  $(".levels", card).append(row);
}

function addQuestion(id, question = { type: "noul" }) {
  const card = fromTemplate("question-template");
  $(".qid", card).value = id;
  $(".qtype", card).value = card.dataset.type = question.type;
  $(".instructions", card).value = textOf(question.instructions);
  if (question.type === "noul") {
    for (const side of ["true", "false"]) $(`.noul-${side}`, card).value = textOf(question.criteria?.[side]);
  } else if (question.type === "choice") {
    for (const [name, description] of Object.entries(question.criteria)) addOption(card, name, textOf(description));
  } else {
    for (const description of question.criteria) addLevel(card, textOf(description));
  }
  // whatever its type now, a card has options and levels ready if the user switches it
  while ($$(".option", card).length < 2) addOption(card);
  while ($$(".level", card).length < 2) addLevel(card);
  $("#questions").append(card);
  return card;
}

function fillForm(request) {
  session.images = []; // an example is a request of its own: the images attached before are not in it
  $("#thumbnails").replaceChildren();
  const structured = typeof request.state !== "string";
  $("#state-json").checked = structured;
  $("#state").value = structured ? JSON.stringify(request.state, null, 2) : request.state;
  $("#state").rows = Math.min(12, Math.max(5, $("#state").value.split("\n").length));
  $("#questions").replaceChildren();
  for (const [id, question] of Object.entries(request.questions)) addQuestion(id, question);
}

// The request the form describes, and the problems that stop it being sent at all.
function readForm() {
  const problems = [];
  let state = $("#state").value;
  if ($("#state-json").checked) {
    try {
      state = JSON.parse(state);
    } catch (error) {
      problems.push({ field: $("#state"), msg: `not valid JSON: ${error.message}` });
    }
  }
  const questions = [];
  for (const card of $$("#questions .question")) {
    const id = $(".qid", card).value;
    if (questions.some(([other]) => other === id)) problems.push({ field: $(".qid", card), msg: `the id "${id}" is used twice` });
    questions.push([id, readQuestion(card, problems)]);
  }
  // fromEntries makes own properties, so an id such as "__proto__" is sent like any other
  const request = { model: $("#model").value, state, questions: Object.fromEntries(questions) };
  if (session.images.length) {
    const texts = JSON.stringify([state, request.questions]); // a placeholder holds no character JSON escapes
    for (const image of session.images) {
      if (!texts.includes(image.placeholder)) {
        problems.push({ field: $("#state"), msg: `${image.placeholder} is in no text of the request: put it in the state, or remove its image` });
      }
    }
    const asset = (image) => ({ type: "image", format: image.format, data_base64: image.dataUrl.slice(image.dataUrl.indexOf(",") + 1) });
    request.assets = Object.fromEntries(session.images.map((image) => [image.placeholder, asset(image)]));
  }
  return { request, problems };
}

function readQuestion(card, problems) {
  const type = $(".qtype", card).value;
  const question = { type };
  const instructions = $(".instructions", card).value;
  if (instructions.trim()) question.instructions = instructions;
  if (type === "noul") {
    const sides = ["true", "false"].map((side) => [side, $(`.noul-${side}`, card).value]).filter(([, text]) => text.trim());
    if (sides.length) question.criteria = Object.fromEntries(sides);
  } else if (type === "choice") {
    const options = [];
    for (const row of $$(".option", card)) {
      const name = $(".name", row).value;
      const description = $(".desc", row).value;
      if (options.some(([other]) => other === name)) problems.push({ field: $(".name", row), msg: `the option "${name}" is listed twice` });
      options.push([name, description.trim() ? description : null]);
    }
    question.criteria = Object.fromEntries(options);
  } else {
    question.criteria = $$(".level .desc", card).map((input) => input.value);
  }
  return question;
}

// --- images in the state ----------------------------------------------------------------------
// Each image is sent as one of Jev's JSON assets, under a placeholder the page writes into a text
// state when the image is attached (onepass's prompt puts the images before the state either way).

// Attaching is offered only where the selected model has a vision projector; otherwise the note says why.
function showImageControl() {
  const name = $("#model").value;
  const takes = session.models.get(name)?.x_takes_images === true;
  $("#image-input").disabled = !takes;
  $("#images").dataset.takesImages = String(takes);
  $("#image-note").textContent = takes
    ? "PNG or JPEG: pick or drop them here"
    : `${name || "this model"} takes no images: serve a vision model with its projector (--mmproj) to attach them`;
}

function nextPlaceholder() {
  const used = new Set(session.images.map((image) => image.placeholder));
  let n = 1;
  while (used.has(`<image-${n}>`)) n += 1;
  return `<image-${n}>`;
}

function readDataUrl(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

// Every file is sent as it is: the server reads the bytes and refuses what is not an image (422).
async function attach(files) {
  clearError();
  for (const file of files) {
    const dataUrl = await readDataUrl(file);
    const image = { placeholder: nextPlaceholder(), name: file.name, dataUrl, format: file.type === "image/jpeg" ? "jpeg" : "png" };
    session.images.push(image);
    $("#thumbnails").append(thumbnail(image));
    if (!$("#state-json").checked) {
      const state = $("#state");
      state.value = `${image.placeholder} ${state.value}`;
    }
  }
}

function thumbnail(image) {
  const picture = Object.assign(el("img"), { src: image.dataUrl, alt: image.name, title: image.name });
  const remove = Object.assign(el("button", "remove-image", "\u00d7"), { type: "button", title: `remove ${image.name}` });
  const item = el("li", "thumbnail", picture, el("code", null, image.placeholder), remove);
  item.dataset.placeholder = image.placeholder;
  remove.addEventListener("click", () => detach(image, item));
  return item;
}

function detach(image, item) {
  session.images = session.images.filter((other) => other !== image);
  item.remove();
  const state = $("#state");
  state.value = state.value.replaceAll(`${image.placeholder} `, "").replaceAll(image.placeholder, "");
}

// --- asking ------------------------------------------------------------------------------------

async function ask() {
  if ($("#ask").disabled) return;
  clearError();
  const { request, problems } = readForm();
  if (problems.length) return showProblems(problems);
  const button = $("#ask");
  button.disabled = true;
  button.textContent = "Asking…";
  const began = performance.now();
  let reply;
  try {
    reply = await call("POST", "v1/systemone", request);
  } catch (error) {
    reply = { unreachable: error };
  } finally {
    button.disabled = false;
    button.textContent = "Ask";
  }
  const elapsed = performance.now() - began;
  if (reply.unreachable) return showUnreachable(reply.unreachable);
  if (reply.status === 401) return askForKey(reply);
  if (!reply.ok) {
    showError(reply);
    if (reply.status === 404) loadModels(true); // the list may have changed (a config reload): show the current one
    return;
  }
  session.completed += 1;
  $("#results").classList.remove("stale");
  $("#answers").replaceChildren(...Object.entries(reply.data.answers).map(([id, answer]) => answerCard(id, answer)));
  showRequest(request, reply.data, elapsed);
}

function bars(probabilities, labelOf, chosen) {
  return el(
    "div",
    "bars",
    ...Object.entries(probabilities).map(([key, p]) => {
      const fill = el("span", "fill");
      fill.style.width = `${(p * 100).toFixed(2)}%`;
      const row = el("div", key === chosen ? "bar chosen" : "bar", el("span", "label", labelOf(key)), el("span", "track", fill), num(p));
      row.dataset.key = key;
      return row;
    }),
  );
}

function yesNo(p) {
  return { true: p, false: 1 - p };
}

// An answer's x_set as "{yes}", "{Billing, Account}", "{1, 2}" or "{}".
function answerSet(set) {
  const labels = set.labels.map((label) => (label === true ? "yes" : label === false ? "no" : String(label)));
  return el("span", "set", `{${labels.join(", ")}}`);
}

function answerCard(id, answer) {
  const card = el("article", "answer", el("h3", null, el("span", "qid", id), " ", el("span", "type", answer.type)));
  card.dataset.qid = id;
  card.dataset.type = answer.type;
  const argmax = (probabilities) => Object.entries(probabilities).reduce((a, b) => (b[1] > a[1] ? b : a))[0];
  let probabilities, labelOf, chosen, raw;
  if (answer.type === "noul") {
    card.append(el("p", "headline", "yes with probability ", num(answer.noul, "noul")));
    [probabilities, labelOf, chosen] = [yesNo(answer.noul), (key) => (key === "true" ? "yes" : "no"), answer.noul >= 0.5 ? "true" : "false"];
    raw = answer.x_raw === undefined ? undefined : yesNo(answer.x_raw);
  } else if (answer.type === "choice") {
    card.append(el("p", "headline", el("strong", "choice", answer.choice), " confidence ", num(answer.confidence, "confidence")));
    [probabilities, labelOf, chosen, raw] = [answer.probabilities, (key) => key, answer.choice, answer.x_raw];
  } else {
    const top = Object.keys(answer.legend).length - 1;
    card.append(el("p", "headline", "expected score ", num(answer.score, "score"), ` of 0–${top}, confidence `, num(answer.confidence, "confidence")));
    [probabilities, labelOf, raw] = [answer.probabilities, (key) => `${key} ${textOf(answer.legend[key])}`, answer.x_raw];
    chosen = argmax(probabilities);
  }
  card.append(bars(probabilities, labelOf, chosen));
  // absent where no next token was read: a decision model's head, a fit that reads the state alone
  if (answer.x_label_mass !== undefined) {
    card.append(el("p", "mass-line", "share of the model's next token on the answer labels: ", num(answer.x_label_mass, "mass")));
    if (answer.x_label_mass < LOW_MASS) {
      const share = `${Math.round(answer.x_label_mass * 100)}%`;
      card.append(el("p", "warning", `Only ${share} of the model's next-token probability fell on the answer labels: it was off format, so these numbers mean less.`));
    }
  }
  if (answer.x_calibration) {
    const fit = answer.x_calibration;
    card.append(el("p", "fit-line", "calibrated by your fit ", el("code", "fit", fit.method), ` (${fit.examples} examples)`));
  }
  if (answer.x_set) {
    // the labels that hold the right one at the coverage asked: not exactly one, an answer to check
    const check = answer.x_set.labels.length === 1 ? [] : [el("span", "check", " not one label: check this answer")];
    const coverage = `${Math.round(100 * answer.x_set.coverage)}%`;
    card.append(el("p", "set-line", `answer set at ${coverage}: `, answerSet(answer.x_set), ...check));
  }
  if (raw !== undefined) {
    card.append(el("details", "raw", el("summary", null, "uncalibrated (x_raw)"), bars(raw, labelOf, argmax(raw))));
  }
  return card;
}

// One request's time as a bar of its parts, drawn against `scale` ms.
function stack(label, timing, scale) {
  const segments = TIMING_PARTS.map((part) => {
    const segment = el("span", `segment ${part}`);
    segment.style.width = `${(100 * timing[part]) / scale}%`;
    segment.title = `${part} ${ms(timing[part])}`;
    return segment;
  });
  return el("div", "stack-row", el("span", null, label), el("span", "stack", ...segments), el("span", null, ms(timing.total)));
}

function showRequest(request, body, elapsed) {
  const timing = body.x_timing_ms;
  const stateKey = JSON.stringify([body.model, request.state, request.assets]);
  const miss = session.misses.get(stateKey);
  if (body.x_cache === "miss") session.misses.set(stateKey, timing);
  // the same state again, from RAM or from disk: show what the cache saved
  const compare = (body.x_cache === "hit" || body.x_cache === "disk") && miss !== undefined;
  const scale = Math.max(timing.total, compare ? miss.total : 0);
  const legend = TIMING_PARTS.flatMap((part) => {
    const item = el("span", `part ${part}`, `${part} ${ms(timing[part])}`);
    Object.assign(item.dataset, { part, value: String(timing[part]) });
    return [item, " "];
  });
  const total = el("span", "total", ms(timing.total));
  total.dataset.value = String(timing.total);
  const panel = $("#request");
  panel.replaceChildren(
    el("p", "summary", "cache ", el("span", `cache ${body.x_cache}`, body.x_cache), ` · ${body.usage.input_tokens} tokens in · total `, total, ` (round trip ${ms(elapsed)}) · ${body.model}`),
    stack("this request", timing, scale),
    ...(compare ? [stack("state new", miss, scale)] : []),
    el("p", "legend", ...legend),
  );
  if (compare) {
    const saved = miss.total - timing.total;
    panel.append(el("p", "saved", `${body.x_cache === "disk" ? "Disk hit" : "Cache hit"}: ${ms(timing.total)} against ${ms(miss.total)} when this state was new: ${ms(saved)} saved (${Math.round((100 * saved) / miss.total)}%).`));
  }
  Object.assign(panel.dataset, { cache: body.x_cache, inputTokens: String(body.usage.input_tokens), completed: String(session.completed) });
  panel.hidden = false;
  const history = $("#history");
  history.prepend(el("li", null, `#${session.completed} ${body.x_cache} · ${ms(timing.total)} · ${body.usage.input_tokens} tokens in`));
  while (history.children.length > 8) history.lastElementChild.remove();
}

// --- errors, shown as the server wrote them --------------------------------------------------

function clearError() {
  $("#error").hidden = true;
  $$(".field-error").forEach((node) => node.remove());
  $$(".invalid").forEach((node) => node.classList.remove("invalid"));
}

function showBox(status, ...lines) {
  const box = $("#error");
  box.replaceChildren(...lines);
  box.dataset.status = status;
  box.hidden = false;
  if (session.completed) $("#results").classList.add("stale"); // what is shown answered an earlier request
}

function showError(reply, retry = null) {
  const detail = reply.data?.detail;
  const lines = [el("strong", null, `${reply.status} ${reply.statusText}`)];
  if (Array.isArray(detail)) {
    lines.push(el("ul", null, ...detail.map((item) => el("li", null, `${item.loc.join(" → ")}: ${item.msg} (${item.type})`))));
    for (const item of detail) markField(fieldFor(item.loc), item.msg);
  } else if (detail && typeof detail === "object") {
    lines.push(el("p", "detail", `${detail.error_type}: ${detail.message}`));
  } else {
    lines.push(el("pre", null, textOf(reply.data)));
  }
  if (reply.retryAfter) {
    lines.push(el("p", "retry-after", `Retry-After: ${reply.retryAfter} s`));
    if (retry) {
      session.retryTimer = setTimeout(retry, 1000 * Number(reply.retryAfter));
      const now = el("button", "retry", "retry now");
      now.type = "button";
      now.addEventListener("click", () => retry());
      lines.push(now);
    }
  }
  showBox(String(reply.status), ...lines);
}

function showUnreachable(error, retry = null) {
  const lines = [el("strong", null, `could not reach onepass at ${baseUrl()}`), el("p", null, String(error))];
  if (retry) {
    const again = el("button", "retry", "retry");
    again.addEventListener("click", () => retry());
    lines.push(again);
  }
  showBox("unreachable", ...lines);
}

function showProblems(problems) {
  showBox("form", el("strong", null, "Not sent: this page found problems in the form"));
  for (const { field, msg } of problems) markField(field, msg);
}

// The form field a 422 `loc` points at: ["body", "questions", id, type, "criteria", option or index].
function fieldFor(loc) {
  const [where, id, , part, item] = loc[0] === "body" ? loc.slice(1) : loc;
  if (where === "state" || where === "model") return $(`#${where}`);
  if (where === "assets") return $$("#thumbnails .thumbnail").find((item) => item.dataset.placeholder === id) ?? $("#thumbnails");
  if (where !== "questions") return null; // the whole body, or a field the form has no place for: listed above
  const card = id === undefined ? null : $$("#questions .question").find((c) => $(".qid", c).value === String(id));
  if (!card) return $("#questions");
  if (loc.includes("[key]")) return $(".qid", card);
  if (part === "instructions") return $(".instructions", card);
  if (part !== "criteria") return card;
  const type = $(".qtype", card).value;
  if (type === "noul" && item !== undefined) return $(`.noul-${item}`, card);
  if (type === "score" && item !== undefined) return $$(".level .desc", card)[item] ?? $(".levels", card);
  if (type === "choice" && item !== undefined) {
    return $$(".option .name", card).find((input) => input.value === String(item)) ?? $(".options", card);
  }
  return $(`.${type}-only`, card);
}

function markField(field, msg) {
  if (!field) return;
  field.classList.add("invalid");
  field.after(el("p", "field-error", msg));
}

// --- handing over to code --------------------------------------------------------------------

function curlFor(request) {
  const quote = (text) => `'${text.replaceAll("'", "'\\''")}'`;
  const lines = [`curl -s ${quote(`${baseUrl()}/v1/systemone`)}`, "-H 'Content-Type: application/json'"];
  if (storedKey()) lines.push('-H "Authorization: Bearer $ONEPASS_API_KEY"');
  lines.push(`-d ${quote(JSON.stringify(request))}`);
  return lines.join(" \\\n  ");
}

// A JSON value as a Python literal: JSON's strings and numbers are already valid Python.
function py(value) {
  if (value === null) return "None";
  if (typeof value === "boolean") return value ? "True" : "False";
  if (Array.isArray(value)) return `[${value.map(py).join(", ")}]`;
  if (typeof value === "object") return `{${Object.entries(value).map(([k, v]) => `${py(k)}: ${py(v)}`).join(", ")}}`;
  return JSON.stringify(value);
}

function pythonFor(request) {
  const types = Object.values(request.questions).map((q) => SDK_CLASSES[q.type]);
  const classes = [...new Set([...types, ...(request.assets ? ["Image"] : [])])].sort();
  const questions = Object.entries(request.questions).map(([id, { type, ...fields }]) => {
    const args = Object.entries(fields).map(([name, value]) => `${name}=${py(value)}`);
    return `            ${py(id)}: ${SDK_CLASSES[type]}(${args.join(", ")}),`;
  });
  const [apiKey, note] = storedKey() ? ['os.environ["ONEPASS_API_KEY"]', ""] : ['"local"', "  # any key works while auth is off"];
  return [
    ...(storedKey() ? ["import os", ""] : []),
    `from typesafe_sdk import ${[...classes, "TypeSafeClient"].join(", ")}`,
    "",
    `with TypeSafeClient(base_url=${py(baseUrl())}, api_key=${apiKey}) as client:${note}`,
    "    result = client.system_one(",
    `        model=${py(request.model)},`,
    `        state=${py(request.state)},`,
    "        questions={",
    ...questions,
    "        },",
    ...(request.assets
      ? [
          "        assets={",
          ...Object.entries(request.assets).map(([placeholder, asset]) => `            ${py(placeholder)}: Image.from_base64(${py(asset.data_base64)}),`),
          "        },",
        ]
      : []),
    "    )",
    "print(result.answers)",
    "",
  ].join("\n");
}

async function copy(kind, render) {
  clearError();
  const { request, problems } = readForm();
  if (problems.length) return showProblems(problems);
  const text = render(request);
  const snippet = $("#snippet");
  Object.assign(snippet, { value: text, hidden: false });
  snippet.dataset.kind = kind;
  const note = $("#copy-note");
  note.hidden = false;
  try {
    await navigator.clipboard.writeText(text);
    note.textContent = `Copied as ${kind}${storedKey() ? " (set ONEPASS_API_KEY to your key)" : ""}:`;
  } catch {
    note.textContent = `The browser did not allow copying: select the ${kind} below and copy it.`;
  }
}

// --- wiring ------------------------------------------------------------------------------------

async function loadExamples() {
  const reply = await call("GET", "examples.json");
  for (const [name, example] of Object.entries(reply.data)) {
    const button = el("button", "example", example.title);
    Object.assign(button, { type: "button", title: `fill the form with a ${example.title}` });
    button.dataset.example = name;
    button.addEventListener("click", () => fillForm(example.request));
    $("#examples").append(button);
  }
  if (!$("#questions").children.length) fillForm(Object.values(reply.data)[0].request);
}

$("#questions").addEventListener("click", (event) => {
  const card = event.target.closest(".question");
  if (event.target.matches(".remove")) card.remove();
  else if (event.target.matches(".remove-item")) event.target.parentElement.remove();
  else if (event.target.matches(".add-option")) addOption(card);
  else if (event.target.matches(".add-level")) addLevel(card);
});
$("#questions").addEventListener("change", (event) => {
  if (event.target.matches(".qtype")) event.target.closest(".question").dataset.type = event.target.value;
});
$("#add-question").addEventListener("click", () => {
  const ids = new Set($$("#questions .qid").map((input) => input.value));
  let n = 1;
  while (ids.has(`q${n}`)) n += 1;
  $(".qid", addQuestion(`q${n}`)).focus();
});
$("#ask").addEventListener("click", ask);
$("#model").addEventListener("change", showImageControl);
$("#image-input").addEventListener("change", async (event) => {
  await attach([...event.target.files]);
  event.target.value = ""; // the same file may be picked again
});
$("#images").addEventListener("dragover", (event) => {
  event.preventDefault();
  $("#images").classList.toggle("dragging", !$("#image-input").disabled);
});
$("#images").addEventListener("dragleave", () => $("#images").classList.remove("dragging"));
$("#images").addEventListener("drop", (event) => {
  event.preventDefault();
  $("#images").classList.remove("dragging");
  if (!$("#image-input").disabled) attach([...event.dataTransfer.files]);
});
document.addEventListener("keydown", (event) => {
  if ((event.ctrlKey || event.metaKey) && event.key === "Enter") {
    event.preventDefault();
    ask();
  }
});
$("#copy-curl").addEventListener("click", () => copy("curl", curlFor));
$("#copy-python").addEventListener("click", () => copy("Python", pythonFor));
$("#key-prompt").addEventListener("submit", (event) => {
  event.preventDefault();
  localStorage.setItem(KEY_STORAGE, $("#key").value.trim());
  $("#key").value = "";
  loadModels();
});
$("#forget-key").addEventListener("click", () => {
  localStorage.removeItem(KEY_STORAGE);
  loadModels();
});

loadExamples();
loadModels();

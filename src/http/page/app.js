// onejob's page: plain DOM, no framework, no build. It uses the public API with the token the user pasted.

const TOKEN_KEY = "onejob-token";
const $ = (id) => document.getElementById(id);
const token = () => sessionStorage.getItem(TOKEN_KEY);

/** Calls the API; answers {status, headers, body}. A 401 signs the user out. */
async function api(path, { method = "GET", body, headers = {} } = {}) {
  const init = { method, headers: { Authorization: `Bearer ${token()}`, ...headers } };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers["Content-Type"] = "application/json";
  }
  const response = await fetch(path, init);
  const text = await response.text();
  const answer = { status: response.status, headers: response.headers, body: text ? JSON.parse(text) : null };
  if (response.status === 401 && path !== "/v1/jobs?limit=1") signOut();
  return answer;
}

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === "dataset") Object.assign(node.dataset, value);
    else if (key in node) node[key] = value;
    else node.setAttribute(key, value);
  }
  node.append(...children);
  return node;
}

function age(iso, now = Date.now()) {
  const s = Math.max(0, Math.round((now - Date.parse(iso)) / 1000));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m`;
  return `${Math.floor(s / 3600)}h`;
}


// ---- sign in -------------------------------------------------------------------------------------------------

async function signIn(event) {
  event.preventDefault();
  const candidate = $("token").value.trim();
  sessionStorage.setItem(TOKEN_KEY, candidate);
  const check = await api("/v1/jobs?limit=1");
  if (check.status !== 200) {
    sessionStorage.removeItem(TOKEN_KEY);
    $("sign-in-error").textContent = `That token was refused (${check.body?.code ?? check.status}).`;
    return;
  }
  $("sign-in-error").textContent = "";
  $("token").value = "";
  route();
}

function signOut() {
  sessionStorage.removeItem(TOKEN_KEY);
  route();
}

// ---- routing -------------------------------------------------------------------------------------------------

let stopView = () => {};

function route() {
  stopView();
  stopView = () => {};
  const signedIn = Boolean(token());
  $("sign-out").hidden = !signedIn;
  $("nav").hidden = !signedIn;
  for (const id of ["sign-in", "home", "job", "providers"]) $(id).hidden = true;
  if (!signedIn) {
    $("sign-in").hidden = false;
    $("token").focus();
    return;
  }
  const match = location.hash.match(/^#\/jobs\/(job_[0-9a-f]{32}(?:_[0-9a-z]{1,13})?)$/);
  if (match) {
    $("job").hidden = false;
    stopView = showJob(match[1]);
  } else if (location.hash === "#/providers") {
    $("providers").hidden = false;
    showProviders();
  } else {
    $("home").hidden = false;
    stopView = showJobs();
  }
}

// ---- the double-click demo -----------------------------------------------------------------------------------

let demoKey = null;

function logRequest(label, answer) {
  const replayed = answer.headers.get("Idempotent-Replayed") === "true";
  const what = answer.status >= 400
    ? `${answer.body?.code}: ${answer.body?.detail}`
    : `${answer.body.id}${replayed ? " (replayed: the job the key already made)" : " (created)"}`;
  $("demo-log").append(el("li", { dataset: { status: String(answer.status) } }, `${label} → HTTP ${answer.status} · ${what}`));
}

async function demoTwice(event) {
  event.preventDefault();
  demoKey = crypto.randomUUID();
  const body = { contract: "summarize@1", input: { text: $("demo-text").value } };
  const send = () => api("/v1/jobs", { method: "POST", body, headers: { "Idempotency-Key": demoKey } });
  $("demo-log").replaceChildren();
  $("demo-verdict").textContent = "Sending twice…";
  const answers = await Promise.all([send(), send()]);
  answers.forEach((answer, i) => logRequest(`click ${i + 1}, key ${demoKey.slice(0, 8)}…`, answer));
  const ids = new Set(answers.filter((a) => a.status < 300).map((a) => a.body.id));
  $("demo-verdict").textContent = ids.size === 1
    ? `2 requests → 1 job (${[...ids][0]})`
    : `2 requests → ${ids.size} jobs`;
  $("demo-changed").disabled = false;
  refreshJobs();
}

async function demoChanged() {
  const body = { contract: "summarize@1", input: { text: `${$("demo-text").value} (edited)` } };
  const answer = await api("/v1/jobs", { method: "POST", body, headers: { "Idempotency-Key": demoKey } });
  logRequest(`changed input, same key ${demoKey.slice(0, 8)}…`, answer);
  $("demo-verdict").textContent = answer.status === 409
    ? "Same key, different intent → 409: the key is taken; nothing was written."
    : `Unexpected: HTTP ${answer.status}`;
}

// ---- the jobs list -------------------------------------------------------------------------------------------

let refreshJobs = () => {};

function showJobs() {
  let timer = null;
  let stopped = false;
  refreshJobs = async () => {
    const answer = await api("/v1/jobs?limit=50");
    if (stopped || answer.status !== 200) return;
    const rows = answer.body.jobs.map((job) =>
      el("tr", { dataset: { id: job.id, status: job.status } },
        el("td", {}, el("a", { href: `#/jobs/${job.id}` }, job.id)),
        el("td", {}, job.contract),
        el("td", {}, el("span", { className: `status ${job.status}` }, job.status)),
        el("td", {}, age(job.created_at))));
    $("jobs").tBodies[0].replaceChildren(...rows);
    $("jobs-empty").hidden = rows.length > 0;
    await refreshAttention(() => stopped);
    await refreshSpend(() => stopped);
  };
  const tick = async () => {
    await refreshJobs();
    if (!stopped) timer = setTimeout(tick, 2000);
  };
  tick();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

/** The jobs waiting for a person (unknown or failed), filtered by status and contract. */
async function refreshAttention(stopped) {
  const wanted = $("attention-status").value;
  const statuses = wanted ? [wanted] : ["unknown", "failed"];
  const pages = await Promise.all(statuses.map((s) => api(`/v1/jobs?status=${s}&limit=50`)));
  if (stopped() || pages.some((p) => p.status !== 200)) return;
  const jobs = pages.flatMap((p) => p.body.jobs).sort((a, b) => b.created_at.localeCompare(a.created_at));
  const contracts = $("attention-contract");
  const chosen = contracts.value;
  const known = [...new Set(jobs.map((j) => j.contract))].sort();
  contracts.replaceChildren(el("option", { value: "" }, "any"),
    ...known.map((c) => el("option", { value: c, selected: c === chosen }, c)));
  const shown = jobs.filter((j) => !chosen || j.contract === chosen);
  const why = (job) => job.status === "unknown"
    ? "no answer in time: stop waiting, or wait"
    : job.error ? `${job.error.code}: ${job.error.message}` : "failed";
  $("attention").tBodies[0].replaceChildren(...shown.map((job) =>
    el("tr", { dataset: { id: job.id, status: job.status } },
      el("td", {}, el("a", { href: `#/jobs/${job.id}` }, job.id)),
      el("td", {}, job.contract),
      el("td", {}, el("span", { className: `status ${job.status}` }, job.status)),
      el("td", {}, why(job)))));
  $("attention-empty").hidden = shown.length > 0;
}

/** The caller's totals since the first of this month (UTC), from `GET /v1/usage`. */
async function refreshSpend(stopped) {
  const today = new Date().toISOString().slice(0, 10);
  const answer = await api(`/v1/usage?from=${today.slice(0, 8)}01&to=${today}`);
  if (stopped() || answer.status !== 200) return;
  const { currency, total, rows } = answer.body;
  const jobs = rows.reduce((n, row) => n + row.jobs, 0);
  const discarded = rows.reduce((sum, row) => sum + row.discarded.cost, 0);
  const unknown = rows.reduce((n, row) => n + row.unknown_attempts, 0);
  $("spend").textContent = `${total.cost.toFixed(6)} ${currency} on ${jobs} jobs · ` +
    `${total.input_tokens} tokens in, ${total.output_tokens} out · ${discarded.toFixed(6)} on discarded answers` +
    (unknown ? ` · ${unknown} attempts' cost not known yet` : "");
}

// ---- providers -----------------------------------------------------------------------------------------------

async function showProviders() {
  const answer = await api("/v1/providers");
  if (answer.status !== 200) return;
  const rows = answer.body.providers.flatMap((p) => p.contracts.map((c, i) =>
    el("tr", { dataset: { provider: p.name, contract: c.contract, standing: c.standing } },
      el("td", {}, i === 0 ? `${p.name} (${p.kind})` : ""),
      el("td", {}, c.contract),
      el("td", {}, el("span", { className: `standing ${c.standing}` }, c.standing)),
      el("td", {}, c.checked_at ? new Date(c.checked_at).toLocaleString() : "—"),
      el("td", {}, c.problem ? `${c.problem.code}: ${c.problem.message}` : ""))));
  $("providers-table").tBodies[0].replaceChildren(...rows);
}

// ---- one job, its timeline -----------------------------------------------------------------------------------

let providerTimeouts = null;

async function timeouts() {
  if (!providerTimeouts) {
    const answer = await api("/v1/providers");
    providerTimeouts = new Map((answer.body?.providers ?? []).map((p) => [p.name, p.timeout_ms]));
  }
  return providerTimeouts;
}

function showJob(id) {
  let stopped = false;
  let job = null;
  let etag = null;
  const controller = new AbortController();
  const clock = setInterval(() => job && !job.settled && render(job), 1000);
  (async () => {
    const limits = await timeouts();
    while (!stopped) {
      const headers = { Authorization: `Bearer ${token()}` };
      if (etag) headers["If-None-Match"] = etag;
      let response;
      try {
        // The job as it is first (a wait without a version would hold the answer until the job next changes),
        // then long polls from the version shown.
        const wait = etag ? 20 : 0;
        response = await fetch(`/v1/jobs/${id}?wait=${wait}`, { headers, signal: controller.signal });
      } catch {
        return;
      }
      if (response.status === 200) {
        etag = response.headers.get("ETag");
        try {
          job = await response.json();
        } catch {
          return; // the view was left (its requests aborted) while the body was read
        }
        render(job, limits);
        // Settled: nothing can change the outcome any more (a failed job may still wait for a cancelled attempt).
        if (job.settled) {
          $("job-live").textContent = "";
          await followEvents(id, () => stopped);
          return;
        }
        $("job-live").textContent = job.settles_at
          ? `live: a cancelled attempt may still answer until ${new Date(job.settles_at).toLocaleTimeString()}`
          : "live";
      } else if (response.status !== 304) {
        const problem = await response.json().catch(() => ({}));
        $("job-status").textContent = problem.code ?? `HTTP ${response.status}`;
        return;
      }
    }
  })();
  return () => {
    stopped = true;
    controller.abort();
    clearInterval(clock);
  };
}

/** The settled job's completion events (if its owner has an endpoint), read again every 2 s while one is not
 * delivered and the view is open. */
async function followEvents(id, stopped) {
  $("job-events").hidden = true;
  while (!stopped()) {
    const answer = await api(`/v1/jobs/${id}/events`);
    const events = answer.status === 200 ? answer.body.events : [];
    if (stopped()) return;
    $("job-events").hidden = events.length === 0;
    $("events-list").replaceChildren(...events.map((event) => {
      const delivered = event.delivered_at !== null;
      const state = delivered
        ? `delivered ${new Date(event.delivered_at).toLocaleTimeString()} after ${event.tries} ${event.tries === 1 ? "try" : "tries"}`
        : event.tries === 0
          ? "not tried yet"
          : `${event.tries} tries, last: ${event.last_error}; next ${new Date(event.next_try_at).toLocaleTimeString()}`;
      return el("li", { dataset: { delivered: String(delivered) } }, `${event.id} · ${event.sink} · ${event.status} · ${state}`);
    }));
    if (events.every((event) => event.delivered_at !== null)) return;
    await new Promise((resolve) => setTimeout(resolve, 2000));
  }
}

function render(job, limits = providerTimeouts ?? new Map()) {
  $("job-title").textContent = job.id;
  const status = $("job-status");
  status.textContent = job.status;
  status.className = `status ${job.status}`;
  const intent = [
    ["Contract", job.contract],
    ["Idempotency key", job.idempotency_key],
    ["Fingerprint", job.fingerprint],
    ["Providers", job.providers.join(" → ")],
    ["Input", JSON.stringify(job.input, null, 2)],
  ];
  $("job-intent").replaceChildren(...intent.flatMap(([term, value]) =>
    [el("dt", {}, term), el("dd", {}, term === "Input" ? el("pre", {}, value) : value)]));
  $("timeline").replaceChildren(...lanes(job, limits));
  renderActions(job);
  $("job-outcome").textContent = job.result !== null
    ? JSON.stringify(job.result, null, 2)
    : job.error ? `${job.error.code}: ${job.error.message}` : "—";
  renderBill(job.bill);
}

/** Every answer paid for, by what became of it; a cost not known yet is said, not shown as zero. */
function renderBill(bill) {
  const row = (label, share) => el("tr", { dataset: { part: label } },
    el("td", {}, label), el("td", {}, String(share.attempts)), el("td", {}, String(share.input_tokens)),
    el("td", {}, String(share.output_tokens)), el("td", {}, `${share.cost.toFixed(6)} ${bill.currency}`));
  $("job-bill").tBodies[0].replaceChildren(row("kept", bill.won), row("discarded", bill.discarded),
    row("failed", bill.failed), row("total", bill.total));
  const notes = [];
  if (bill.possibly_paid_attempts.length) {
    notes.push(`Attempt ${bill.possibly_paid_attempts.join(", ")}: retried by the provider's policy while its answer was unknown, so it may have been billed as well as the retry.`);
  }
  if (bill.unknown_attempts.length) {
    notes.push(`Attempt ${bill.unknown_attempts.join(", ")}: no answer yet, so its cost is not known (it may have been billed).`);
  }
  if (bill.unpriced_attempts.length) {
    notes.push(`Attempt ${bill.unpriced_attempts.join(", ")}: no price configured; its tokens are counted, its cost is not.`);
  }
  $("bill-note").textContent = notes.join(" ");
}

/** How many attempts the job had when its actions were last shown: part of each action's key. */
let shownAttempts = 0;

/** What a person can do about the job now, each a plain API call whose result is shown and then seen on the
 * timeline (the long poll brings the change). */
function renderActions(job) {
  shownAttempts = job.attempts.length;
  const live = job.attempts.find((a) => ["queued", "started", "unknown"].includes(a.state));
  const open = !["succeeded", "cancelled"].includes(job.status);
  const stop = $("action-stop");
  stop.hidden = !live;
  if (live) {
    stop.textContent = `Stop waiting on attempt ${live.number}`;
    stop.dataset.attempt = String(live.number);
  }
  $("action-retry-group").hidden = !open || Boolean(live);
  $("action-cancel").hidden = !open;
  const select = $("action-provider");
  if (select.options.length === 0 && providerTimeouts) {
    select.replaceChildren(...[...providerTimeouts.keys()].map((name) => el("option", { value: name }, name)));
  }
}

/** Each action is one intent: its `Idempotency-Key` names the action, what it asks and the job as the person saw
 * it, so a double click acts once, and the same button after the job moved on is a new intent. */
async function act(label, path, body) {
  const id = $("job-title").textContent;
  const key = `page:${id}${path}:${body?.provider ?? ""}:after-${shownAttempts}`;
  const answer = await api(`/v1/jobs/${id}${path}`, { method: "POST", body, headers: { "Idempotency-Key": key } });
  $("action-result").textContent = answer.status < 300
    ? `${label}: done (HTTP ${answer.status})`
    : `${label}: HTTP ${answer.status} · ${answer.body?.code}: ${answer.body?.detail}`;
  $("action-result").dataset.status = String(answer.status);
  // A settled job's view stopped following it: follow it again, from the job as the action left it.
  if (answer.status < 300) route();
}

/** One lane per attempt: bars for queued, started and unknown on one time axis, the outcome at the end. */
function lanes(job, limits) {
  const now = Date.now();
  const t = (iso) => (iso ? Date.parse(iso) : null);
  const start = t(job.created_at);
  const ends = job.attempts.map((a) => t(a.finished_at) ?? now);
  const end = Math.max(start + 1, ...ends);
  const at = (ms) => `${((ms - start) / (end - start)) * 100}%`;
  const bar = (kind, from, to) => {
    const seg = el("span", { className: `seg ${kind}`, title: `${kind} ${((to - from) / 1000).toFixed(1)} s` });
    seg.style.left = at(from);
    seg.style.width = `calc(${at(to)} - ${at(from)})`;
    return seg;
  };
  return job.attempts.map((a) => {
    const created = t(a.created_at);
    const started = t(a.started_at);
    const finished = t(a.finished_at) ?? now;
    const track = el("div", { className: "track" });
    track.append(bar("queued", created, started ?? finished));
    if (started !== null) {
      const timeout = limits.get(a.provider);
      const unknownFrom = timeout !== undefined && finished - started > timeout ? started + timeout : null;
      track.append(bar("started", started, unknownFrom ?? finished));
      if (unknownFrom !== null) track.append(bar("unknown", unknownFrom, finished));
    }
    const winner = job.completed_by === a.number;
    let outcome = a.state;
    if (winner) outcome = "★ winner";
    else if (a.state === "queued" && a.retry_of) {
      const cause = job.attempts.find((b) => b.number === a.retry_of)?.error?.code ?? "a refusal";
      const when = new Date(a.not_before).toLocaleTimeString();
      outcome = `retry of #${a.retry_of} after ${cause}, not before ${when}`;
    }
    else if (a.state === "discarded") {
      outcome = job.completed_by ? `discarded — lost to #${job.completed_by}` : "discarded — job cancelled";
    } else if (a.error) outcome = `${a.state}: ${a.error.code}`;
    if (a.cleared) {
      const how = {
        late_answer: "its late answer",
        lookup: "asking the provider",
        policy: "the provider's retry policy (may be paid twice)",
        person: "a person",
      }[a.cleared.by] ?? a.cleared.by;
      outcome += ` · unknown cleared by ${how} at ${new Date(a.cleared.at).toLocaleTimeString()}`;
    }
    const elapsed = `${((finished - (started ?? created)) / 1000).toFixed(1)} s`;
    return el("div", {
      className: `lane ${a.state}${winner ? " winner" : ""}`,
      role: "listitem",
      dataset: { attempt: String(a.number), state: a.state, cleared: a.cleared?.by ?? "" },
      "aria-label": `Attempt ${a.number} on ${a.provider}: ${a.state}${winner ? ", winner" : ""}`,
    },
    el("span", { className: "who" }, `#${a.number} ${a.provider}${a.retry_of ? ` (retry of #${a.retry_of})` : ""}`),
    track,
    el("span", { className: "outcome" }, `${outcome} · ${elapsed}`));
  });
}

// ---- start ---------------------------------------------------------------------------------------------------

$("sign-in-form").addEventListener("submit", signIn);
$("sign-out").addEventListener("click", signOut);
$("demo-form").addEventListener("submit", demoTwice);
$("demo-changed").addEventListener("click", demoChanged);
$("attention-status").addEventListener("change", () => refreshJobs());
$("attention-contract").addEventListener("change", () => refreshJobs());
$("action-stop").addEventListener("click", () =>
  act(`Stop waiting on attempt ${$("action-stop").dataset.attempt}`, `/attempts/${$("action-stop").dataset.attempt}/cancel`));
$("action-retry").addEventListener("click", () =>
  act(`Retry on ${$("action-provider").value}`, "/attempts", { provider: $("action-provider").value }));
$("action-cancel").addEventListener("click", () => act("Cancel the job", "/cancel"));
window.addEventListener("hashchange", route);
route();

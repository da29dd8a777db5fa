// The page at / in Debian's headless Chromium, driven by playwright-core (no browser download). Run by
// scripts/browser-test, which starts a local server with demo-backup qualified for summarize@1.
//
// It signs in, runs the double-click demo (two requests, one job; a changed input under the same key, a 409), opens
// a job whose primary failed and whose fallback won from the jobs list, and checks the timeline: two lanes, the
// first failed, the second the winner; and the job's completion event, delivered to a receiver the test runs. Then
// the operator's actions: the jobs that need attention (filtered), an unknown attempt stopped (failover follows), a
// failed job retried on a chosen provider, a job cancelled, and the providers with their standing.
// Screenshots go to target/browser/.

import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { createServer } from "node:http";
import { chromium } from "playwright-core";

const base = process.env.ONEJOB_URL;
const shots = process.env.SCREENSHOTS ?? "target/browser";
assert.ok(base, "ONEJOB_URL is not set");
mkdirSync(shots, { recursive: true });

/** A job created through the API, as another client would. */
async function createJob(key, body) {
  const response = await fetch(`${base}/v1/jobs`, {
    method: "POST",
    headers: { Authorization: "Bearer dev-token-alice", "Idempotency-Key": key, "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
  assert.equal(response.status, 201);
  return (await response.json()).id;
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync"],
});
let page;
try {
  page = await browser.newPage({ viewport: { width: 1100, height: 900 } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(e.message));
  page.setDefaultTimeout(15000);

  // Sign in: a wrong token is refused, the dev token is taken.
  await page.goto(base);
  await page.getByLabel("API token").fill("wrong-token");
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByRole("alert").filter({ hasText: "That token was refused (unauthorized)." }).waitFor();
  await page.getByLabel("API token").fill("dev-token-alice");
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByRole("heading", { name: "Double click" }).waitFor();

  // The double-click demo: two concurrent requests under one key make one job.
  await page.getByLabel("Text to summarise").fill("The projector broke. The meeting moved to Thursday.");
  await page.getByRole("button", { name: "Click twice (one key)" }).click();
  const verdict = page.locator("#demo-verdict");
  await verdict.filter({ hasText: "2 requests → 1 job (job_" }).waitFor();
  const statuses = await page.locator("#demo-log li").evaluateAll((items) => items.map((li) => li.dataset.status));
  assert.deepEqual(statuses.sort(), ["200", "201"], "one created, one replayed");
  const demoJob = (await verdict.textContent()).match(/job_[0-9a-f]{32}_[0-9a-z]+/)[0];
  await page.getByRole("button", { name: "Same key, changed input" }).click();
  await verdict.filter({ hasText: "409" }).waitFor();
  const refused = await page.locator("#demo-log li").last().textContent();
  assert.match(refused, /HTTP 409 · idempotency_key_reused/);
  // The list shows the one job (live: it appears without a reload).
  await page.locator(`#jobs tr[data-id="${demoJob}"]`).waitFor();
  await page.screenshot({ path: `${shots}/home.png`, fullPage: true });

  // Alice's completion events go to a receiver here (the server allows loopback endpoints for it).
  const received = [];
  const receiver = createServer((request, response) => {
    request.resume();
    received.push(request.headers["onejob-event-id"]);
    response.writeHead(204).end();
  });
  await new Promise((resolve) => receiver.listen(0, "127.0.0.1", resolve));
  const endpoint = await fetch(`${base}/v1/endpoint`, {
    method: "PUT",
    headers: { Authorization: "Bearer dev-token-alice", "Content-Type": "application/json" },
    body: JSON.stringify({ url: `http://127.0.0.1:${receiver.address().port}/onejob` }),
  });
  assert.equal(endpoint.status, 200);

  // A job whose primary fails over to the (qualified) fallback, opened from the list.
  const failover = await createJob(`browser-failover-${Date.now()}`, {
    contract: "summarize@1",
    input: { text: "Primary fails. Fallback wins." },
    providers: ["demo-fail", "demo-backup"],
  });
  await page.locator(`#jobs a[href="#/jobs/${failover}"]`).click();
  await page.getByRole("heading", { name: failover }).waitFor();
  const lanes = page.getByRole("listitem").filter({ has: page.locator(".track") });
  await page.locator('#timeline .lane[data-attempt="2"][data-state="succeeded"]').waitFor();
  assert.equal(await lanes.count(), 2, "one lane per attempt");
  const first = page.locator('#timeline .lane[data-attempt="1"]');
  const second = page.locator('#timeline .lane[data-attempt="2"]');
  assert.equal(await first.getAttribute("data-state"), "failed");
  assert.equal(await first.getAttribute("aria-label"), "Attempt 1 on demo-fail: failed");
  assert.match(await first.locator(".outcome").textContent(), /failed: provider_error/);
  assert.equal(await second.getAttribute("aria-label"), "Attempt 2 on demo-backup: succeeded, winner");
  assert.ok((await second.getAttribute("class")).includes("winner"));
  assert.match(await second.locator(".outcome").textContent(), /★ winner/);
  assert.equal(await page.locator("#job-status").textContent(), "succeeded");
  assert.match(await page.locator("#job-outcome").textContent(), /"summary": "Primary fails."/);
  // Settled: its one event, delivered to the receiver, under the id the receiver got.
  const event = page.locator('#events-list li[data-delivered="true"]');
  await event.waitFor();
  assert.equal(await page.locator("#events-list li").count(), 1);
  assert.match(await event.textContent(), /^evt_[0-9a-f]{32} · endpoint · succeeded · delivered .* after 1 try$/);
  assert.ok(received.includes((await event.textContent()).split(" ")[0]), "the receiver got that event");
  receiver.close();
  await page.screenshot({ path: `${shots}/job-timeline.png`, fullPage: true });

  // The operator's actions. A job whose primary hangs is `unknown` after its 3 s timeout, and two whose only
  // provider fails end `failed`: all three need attention.
  const stamp = Date.now();
  const hanging = await createJob(`browser-hang-${stamp}`, {
    contract: "summarize@1", input: { text: "Slow primary." }, providers: ["demo-slow", "demo-backup"],
  });
  const failed = await createJob(`browser-failed-${stamp}`, {
    contract: "summarize@1", input: { text: "Nobody answers." }, providers: ["demo-fail"],
  });
  const doomed = await createJob(`browser-doomed-${stamp}`, {
    contract: "summarize@1", input: { text: "Nobody answers either." }, providers: ["demo-fail"],
  });
  await page.goto(`${base}/#/`);
  await page.locator(`#attention tr[data-id="${failed}"][data-status="failed"]`).waitFor();
  await page.locator(`#attention tr[data-id="${hanging}"][data-status="unknown"]`).waitFor();
  assert.match(await page.locator(`#attention tr[data-id="${failed}"]`).textContent(), /providers_exhausted/);
  await page.getByLabel("Status").selectOption("unknown");
  await page.locator(`#attention tr[data-id="${failed}"]`).waitFor({ state: "detached" });
  await page.screenshot({ path: `${shots}/attention.png`, fullPage: true });

  // Stop waiting on the unknown attempt: it is cancelled, and failover takes the job to the qualified fallback.
  await page.locator(`#attention a[href="#/jobs/${hanging}"]`).click();
  await page.getByRole("heading", { name: hanging }).waitFor();
  await page.getByRole("button", { name: "Stop waiting on attempt 1" }).click();
  await page.locator("#action-result").filter({ hasText: "done (HTTP 200)" }).waitFor();
  await page.locator('#timeline .lane[data-attempt="2"][data-state="succeeded"]').waitFor();
  assert.equal(await page.locator('#timeline .lane[data-attempt="1"]').getAttribute("data-state"), "cancelled");

  // Retry a failed job on a chosen provider: a new attempt there, which wins.
  await page.goto(`${base}/#/jobs/${failed}`);
  await page.locator("#job-status").filter({ hasText: "failed" }).waitFor();
  await page.getByLabel("Retry on").selectOption("demo-backup");
  await page.getByRole("button", { name: "Retry", exact: true }).click();
  await page.locator("#action-result").filter({ hasText: "Retry on demo-backup: done (HTTP 201)" }).waitFor();
  await page.locator('#timeline .lane[data-attempt="2"][data-state="succeeded"]').waitFor();

  // Cancel a job.
  await page.goto(`${base}/#/jobs/${doomed}`);
  await page.locator("#job-status").filter({ hasText: "failed" }).waitFor();
  await page.getByRole("button", { name: "Cancel the job" }).click();
  await page.locator("#job-status").filter({ hasText: "cancelled" }).waitFor();
  assert.ok(await page.getByRole("button", { name: "Cancel the job" }).isHidden(), "nothing left to cancel");

  // The providers: standing per contract; breakers, moved by every owner's calls, are not an owner's to see.
  await page.getByRole("link", { name: "Providers" }).click();
  const backup = page.locator('#providers-table tr[data-provider="demo-backup"][data-contract="summarize@1"]');
  await backup.waitFor();
  assert.equal(await backup.getAttribute("data-standing"), "qualified");
  assert.ok(!(await page.locator("#providers-table").innerText()).includes("recent failures"), "no breaker counters");
  const sloppy = page.locator('#providers-table tr[data-provider="demo-sloppy"][data-contract="summarize@1"]');
  assert.equal(await sloppy.getAttribute("data-standing"), "unqualified");
  await page.screenshot({ path: `${shots}/providers.png`, fullPage: true });

  // Readable at phone width.
  await page.setViewportSize({ width: 390, height: 844 });
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  assert.ok(overflow <= 0, `the page is ${overflow}px wider than a phone`);
  await page.screenshot({ path: `${shots}/job-timeline-phone.png`, fullPage: true });

  assert.deepEqual(errors, [], "no script errors");
  console.log(`page test passed; screenshots in ${shots}/`);
} catch (e) {
  if (page) await page.screenshot({ path: `${shots}/failure.png`, fullPage: true }).catch(() => {});
  throw e;
} finally {
  await browser.close();
}

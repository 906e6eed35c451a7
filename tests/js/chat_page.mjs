// chat_page.mjs TESSERA MODEL_DIR NODE_MODULES — the chat page at GET /
// (src/server/chat_page.html) in headless Chromium (Debian's chromium,
// driven by playwright-core from NODE_MODULES) against `tessera serve
// --api-key`: without the key the page shows the server's error; with it
// the model list loads, a message streams in over several updates to the
// same text a direct request gets, with TTFT and tokens/s; a long reply
// (the network throttled so that it takes seconds) is stopped mid-stream
// and the page takes the next message; a wrong key's error is shown.
// MODEL_DIR is the default model (models/kjv-qwen3: slow enough, about
// 100 tokens/s here, that a reply arrives in many pieces; the tiny test
// model's whole reply comes in one), served with a plain chat template of
// ours in a folder of links. Exit 77 (skipped) only when chromium is absent.
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync,
  writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { createRequire } from "node:module";
import { join, resolve } from "node:path";
import assert from "node:assert/strict";

const [exe, srcModel, nodeModules] = process.argv.slice(2);
const chromiumPath = "/usr/bin/chromium";
if (!existsSync(chromiumPath)) {
  console.log("chat_page: skipped: no /usr/bin/chromium (Debian's chromium package)");
  process.exit(77);
}
const { chromium } = createRequire(join(resolve(nodeModules), "noop.js"))("playwright-core");

// the model's files, its tokenizer_config.json with a chat template added
const modelDir = mkdtempSync(join(tmpdir(), "chat-page-"));
for (const f of readdirSync(srcModel))
  if (f !== "tokenizer_config.json") symlinkSync(resolve(srcModel, f), join(modelDir, f));
const tc = JSON.parse(readFileSync(join(srcModel, "tokenizer_config.json"), "utf8"));
tc.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] | trim }}\n" +
  "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}";
writeFileSync(join(modelDir, "tokenizer_config.json"), JSON.stringify(tc));

const KEY = "page-test-key";
const port = 23000 + (process.pid % 1000);
const base = `http://127.0.0.1:${port}`;
const server = spawn(exe, ["serve", "-m", modelDir, "--port", String(port),
  "--kv-blocks", "64", "--max-seqs", "4", "--served-model-name", "tiny", "--api-key", KEY],
  { stdio: ["ignore", "ignore", "pipe"] });
let log = "";
server.stderr.on("data", (d) => { log += d; });
const exited = new Promise((res) => server.on("exit", (code, sig) => res({ code, sig })));

async function waitUp() {
  for (let i = 0; i < 100; i++) {
    try {
      if ((await fetch(`${base}/health`)).ok) return;
    } catch { /* not yet */ }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error("server did not come up: " + log);
}

// what the page should show for the same request, asked directly
async function direct(messages, max_tokens) {
  const r = await fetch(`${base}/v1/chat/completions`, { method: "POST",
    headers: { "Content-Type": "application/json", Authorization: `Bearer ${KEY}` },
    body: JSON.stringify({ model: "tiny", messages, temperature: 0, max_tokens }) });
  assert.equal(r.status, 200, await r.clone().text());
  return (await r.json()).choices[0].message.content;
}

const lastReply = (page) => page.locator(".msg.assistant").last();

// records every text a reply's .text is given from now on, in order, and
// when (window.__updates: [ms, text]); one observer per page
async function recordUpdates(page) {
  await page.evaluate(() => {
    window.__updates = [];
    if (window.__observer) return;
    window.__observer = new MutationObserver((records) => {
      for (const r of records)
        if (r.target.classList && r.target.classList.contains("text") &&
            r.target.parentElement.classList.contains("assistant"))
          for (const n of r.addedNodes)
            window.__updates.push([Math.round(performance.now()), n.textContent]);
    });
    window.__observer.observe(document.getElementById("messages"),
      { childList: true, subtree: true });
  });
}
const textUpdates = (page) => page.evaluate(() =>
  window.__updates.filter(([, s]) => s.length));

async function sendMessage(page, text) {
  await page.fill("#input", text);
  await page.click("#send");
}

async function main() {
  await waitUp();
  const browser = await chromium.launch({ executablePath: chromiumPath, headless: true,
    args: ["--no-sandbox", "--disable-gpu"] });
  try {
    const page = await browser.newPage();
    const pageErrors = [];
    page.on("pageerror", (e) => pageErrors.push(String(e)));
    // nothing but this server is fetched
    const foreign = [];
    page.on("request", (req) => { if (!req.url().startsWith(base)) foreign.push(req.url()); });

    const cdp = await page.context().newCDPSession(page);
    await cdp.send("Network.enable");
    const throttle = (bytesPerSecond) => cdp.send("Network.emulateNetworkConditions",
      { offline: false, latency: 0, downloadThroughput: bytesPerSecond, uploadThroughput: -1 });

    const resp = await page.goto(base + "/");
    assert.equal(resp.status(), 200, "GET / must serve the chat page");
    assert.match(resp.headers()["content-type"], /^text\/html/);

    // no key: /v1/models is refused and the page says why (the server's words)
    await page.locator("#error").waitFor({ state: "visible", timeout: 10000 });
    assert.match(await page.textContent("#error"), /401: a missing or wrong API key/);
    assert.equal(await page.locator("#model option").count(), 0);

    // the key: the model list loads
    await page.fill("#api-key", KEY);
    await page.press("#api-key", "Tab"); // change event
    await page.waitForFunction(() => document.querySelectorAll("#model option").length === 1);
    assert.equal(await page.inputValue("#model"), "tiny");
    await page.selectOption("#model", "tiny");
    assert.ok(!(await page.isVisible("#error")), "the error stays after the models loaded");

    // a reply streams in, equal to the direct answer, with TTFT and tokens/s
    await page.fill("#system", "Be brief.");
    await page.fill("#temperature", "0");
    await page.fill("#max-tokens", "40");
    await recordUpdates(page);
    await sendMessage(page, "Hello world");
    await lastReply(page).and(page.locator("[data-done='1']")).waitFor({ timeout: 30000 });
    const want = await direct([{ role: "system", content: "Be brief." },
      { role: "user", content: "Hello world" }], 40);
    const got = await lastReply(page).locator(".text").textContent();
    assert.ok(want.length > 0, "the tiny model's reply is empty; pick another prompt");
    assert.equal(got, want);
    const updates = await textUpdates(page);
    const times = new Set(updates.map(([t]) => t));
    assert.ok(updates.length >= 2 && times.size >= 2,
      `the text appeared in ${updates.length} update(s) at ${times.size} time(s): ${JSON.stringify(updates)}`);
    for (let i = 1; i < updates.length; i++)
      assert.ok(updates[i][1].startsWith(updates[i - 1][1]) &&
        updates[i][1].length > updates[i - 1][1].length,
        `update ${i} does not extend the text: ${JSON.stringify(updates)}`);
    assert.equal(updates[updates.length - 1][1], want);
    const stats = await lastReply(page).locator(".stats").textContent();
    assert.match(stats, /TTFT \d+ ms/);
    assert.match(stats, /\d+(\.\d+)? tokens\/s/);
    assert.match(stats, /40 tokens/); // the usage chunk's count (finish: length)
    assert.equal(await page.locator(".msg.user").last().textContent(), "Hello world");

    // a long reply (400 tokens of about 180 bytes each at 4 KB/s: 18 s,
    // whatever the machine's speed), stopped once it has grown twice
    await throttle(4000);
    await page.fill("#max-tokens", "400");
    await recordUpdates(page);
    await sendMessage(page, "Tell me a long story");
    assert.ok(await page.isDisabled("#send"), "send stays enabled while streaming");
    await page.waitForFunction(() => new Set(window.__updates.filter(([, s]) => s.length)
      .map(([t]) => t)).size >= 2, null, { timeout: 30000 }).catch(async (e) => {
      throw new Error(`${e.message}; the reply so far: ${await page.evaluate(() =>
        JSON.stringify([window.__updates, document.getElementById("error").textContent]))}`);
    });
    await page.click("#stop");
    await lastReply(page).and(page.locator("[data-done='1']")).waitFor({ timeout: 5000 });
    const stoppedAt = await lastReply(page).locator(".text").textContent();
    assert.ok(stoppedAt.length > 0);
    assert.ok(await lastReply(page).evaluate((e) => e.classList.contains("stopped")));
    await new Promise((r) => setTimeout(r, 1500));
    assert.equal(await lastReply(page).locator(".text").textContent(), stoppedAt,
      "the text still grows after stop");
    assert.ok(await page.isEnabled("#send") && await page.isDisabled("#stop") &&
      await page.isEnabled("#input"), "the page is not usable again after stop");
    assert.ok(!(await page.isVisible("#error")), "stop shows an error");
    await throttle(-1);

    // the next message goes through (the stopped turn is part of the history)
    await page.fill("#temperature", "0");
    await page.fill("#max-tokens", "8");
    await sendMessage(page, "And now?");
    await lastReply(page).and(page.locator("[data-done='1']")).waitFor({ timeout: 30000 });
    assert.equal(await page.locator(".msg.assistant").count(), 3);
    assert.ok(!(await lastReply(page).evaluate((e) => e.classList.contains("stopped"))));

    // a wrong key: the server's message is shown, no empty reply stays
    await page.fill("#api-key", "wrong-key");
    await sendMessage(page, "Hello again");
    await page.locator("#error").waitFor({ state: "visible", timeout: 10000 });
    assert.match(await page.textContent("#error"), /401: a missing or wrong API key/);
    await page.waitForFunction(() => !document.getElementById("send").disabled);
    assert.equal(await page.locator(".msg.assistant").count(), 3);

    assert.deepEqual(pageErrors, [], "JavaScript errors on the page");
    assert.deepEqual(foreign, [], "the page fetched something not from this server");
  } finally {
    await browser.close();
  }
}

let failed = false;
try {
  await main();
  console.log("chat_page: ok");
} catch (e) {
  failed = true;
  console.error(e);
  console.error("server log:\n" + log);
} finally {
  server.kill("SIGTERM");
  const { code, sig } = await exited;
  rmSync(modelDir, { recursive: true, force: true });
  if (!failed && code !== 0) {
    console.error(`server exited ${code} ${sig}`);
    failed = true;
  }
}
process.exit(failed ? 1 : 0);

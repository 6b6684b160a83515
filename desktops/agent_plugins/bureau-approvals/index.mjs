// Le Bureau's approvals inside OpenClaw: a command the workspace's policy names (`git push`, `sudo`…)
// waits for an operator's decision before it runs, without the agent having to ask.
//
// Written into each desktop by the control plane (desktops/agent_config.py) and loaded by the gateway
// from `plugins.load.paths` when it starts (its manifest asks for that). The policy, written beside it,
// is read on every call, so a new policy applies without reloading the plugin.
// The request goes through `bureau approve`, which asks the control plane's guest endpoint with the
// desktop's token and waits; its decision is bound to the exact command, directory, environment and
// session asked about. Anything but an approval (a denial, no answer in time, an error) blocks.
// It also counts every command the agent runs and reports the count to the guest endpoint every few
// seconds, so that the control plane can tell a burst of commands (its alerts).
// And it shows them on the desktop's screen, the one the operator watches: each command, then what it
// printed, appended to a log that a terminal window on that screen follows (opened again if closed).
// None of that holds a command back, and a failure of it never fails one.
import { spawn } from "node:child_process";
import { existsSync, mkdirSync, readFileSync } from "node:fs";
import { appendFile } from "node:fs/promises";
import { homedir } from "node:os";
import { isAbsolute, join } from "node:path";
import { sensitivePattern } from "./commands.mjs";

const POLICY = join(homedir(), ".openclaw", "bureau", "approvals.json");
// `bureau approve` exits 0 approved, 1 denied, 2 timed out, 3 could not ask.
const APPROVED = 0;
const OUTCOME = {
  1: "An operator denied this command; it did not run.",
  2: "No operator answered in time; the command did not run.",
};
// OpenClaw gives a before_tool_call hook at most this long (ms); the policy's timeout stays below it.
const HOOK_BUDGET = 600_000;
// What the control plane keeps of a title.
const MAX_TITLE = 200;
// Where the desktop's credential for the control plane's guest endpoint, and its address, are written.
const BUREAU_CONFIG = process.env.BUREAU_CONFIG_DIR || "/etc/bureau";
// Commands are reported in batches, at most this often (ms): one request per command would make a
// burst of commands a burst of requests too.
const REPORT_EVERY = 2_000;
// The most commands the guest endpoint takes in one report.
const MAX_REPORT = 100_000;
// What the terminal on the screen follows, and how much of a command's output it shows.
const SCREEN_LOG = join(homedir(), ".cache", "bureau", "agent-commands.log");
const MAX_SHOWN = 4_000;

function readPolicy() {
  return JSON.parse(readFileSync(POLICY, "utf8"));
}

function ask({ title, details, cwd, timeout, signal }) {
  return new Promise((resolve) => {
    const args = ["approve", "--title", title, "--details", "-", "--timeout", `${timeout}s`];
    const child = spawn("bureau", args, { cwd, signal, stdio: ["pipe", "pipe", "pipe"] });
    let out = "";
    let err = "";
    child.stdout.on("data", (chunk) => (out += chunk));
    child.stderr.on("data", (chunk) => (err += chunk));
    child.on("error", (error) => resolve({ code: 3, comment: "", error: String(error) }));
    child.on("close", (code) => resolve({ code, comment: out.trim(), error: err.trim() }));
    child.stdin.end(details);
  });
}

let unreported = 0;
let reporting = null;

function bureauSetting(name) {
  return readFileSync(join(BUREAU_CONFIG, name), "utf8").trim();
}

// A timer that holds no command back and does not keep the gateway alive.
function reportSoon() {
  reporting ??= setTimeout(report, REPORT_EVERY).unref();
}

async function report() {
  reporting = null;
  const commands = Math.min(unreported, MAX_REPORT);
  unreported -= commands;
  try {
    const answer = await fetch(`${bureauSetting("guest_url")}/v1/activity`, {
      method: "POST",
      headers: { Authorization: `Bearer ${bureauSetting("token")}`, "Content-Type": "application/json" },
      body: JSON.stringify({ commands }),
      signal: AbortSignal.timeout(10_000),
    });
    if (!answer.ok) {
      throw new Error(`the guest endpoint answered ${answer.status}`);
    }
  } catch (error) {
    unreported += commands; // told with the next report
    console.warn(`bureau-approvals: ${commands} command(s) not reported yet (${error})`);
  }
  if (unreported) {
    reportSoon(); // those run meanwhile, or those this report failed to tell
  }
}

let screen = { display: ":0", title: "Agent" };
let terminal = null;
// Appends one after the other, so that a command's output never lands before the command.
let appending = Promise.resolve();

// A terminal window on the desktop's screen following the log, unless one we opened still runs.
function terminalShow() {
  if (terminal) {
    return;
  }
  try {
    mkdirSync(join(homedir(), ".cache", "bureau"), { recursive: true });
    // In the screen's bottom right-hand corner, small enough to leave the browser the agent drives in view.
    const args = ["--disable-server", "--hide-menubar", "--geometry=100x14-0-0", "--title", screen.title];
    // `tail -F` follows the log even while it does not exist yet, or once it is replaced.
    args.push("--command", `tail -n 200 -F ${SCREEN_LOG}`);
    terminal = spawn("xfce4-terminal", args, {
      env: { ...process.env, DISPLAY: screen.display },
      stdio: "ignore",
      detached: true,
    });
    terminal.on("error", () => (terminal = null));
    terminal.on("exit", () => (terminal = null));
    terminal.unref();
  } catch (error) {
    terminal = null;
    console.warn(`bureau-approvals: no terminal on the screen (${error})`);
  }
}

function screenShow(text) {
  terminalShow();
  appending = appending
    .then(() => appendFile(SCREEN_LOG, text))
    .catch((error) => console.warn(`bureau-approvals: not shown on the screen (${error})`));
}

// The text a tool result carries (OpenClaw's results are lists of content blocks).
function resultText(event) {
  if (event.error) {
    return String(event.error);
  }
  const content = event.result?.content;
  const text = Array.isArray(content)
    ? content.filter((block) => block?.type === "text").map((block) => block.text).join("\n")
    : typeof event.result === "string"
      ? event.result
      : JSON.stringify(event.result ?? "");
  return text.length > MAX_SHOWN ? `${text.slice(0, MAX_SHOWN)}\n[…]` : text;
}

function afterExec(event) {
  try {
    const text = resultText(event);
    screenShow(text.endsWith("\n") || !text ? text : `${text}\n`);
  } catch (error) {
    console.warn(`bureau-approvals: not shown on the screen (${error})`);
  }
}

async function beforeExec(event, ctx) {
  unreported += 1;
  reportSoon();
  const command = typeof event.params?.command === "string" ? event.params.command : "";
  screenShow(`\n$ ${command}\n`);
  let policy;
  try {
    policy = readPolicy();
  } catch (error) {
    return { block: true, blockReason: `The approval policy cannot be read (${error}); nothing runs.` };
  }
  const rule = sensitivePattern(command, policy.commands ?? []);
  if (!rule) {
    return undefined;
  }
  const workdir = typeof event.params.workdir === "string" ? event.params.workdir : null;
  const details = JSON.stringify(
    { command, workdir, env: event.params.env ?? null, session: ctx.sessionKey ?? null, rule },
    null,
    2,
  );
  const title = command.length > MAX_TITLE ? `${command.slice(0, MAX_TITLE - 1)}…` : command;
  const cwd = workdir && isAbsolute(workdir) && existsSync(workdir) ? workdir : process.cwd();
  const answer = await ask({ title, details, cwd, timeout: policy.timeout, signal: ctx.abortSignal });
  if (answer.code === APPROVED) {
    return undefined;
  }
  const why =
    OUTCOME[answer.code] ?? `The approval could not be asked (${answer.error}); the command did not run.`;
  return { block: true, blockReason: answer.comment ? `${why} The operator said: ${answer.comment}` : why };
}

export default {
  id: "bureau-approvals",
  name: "Le Bureau approvals",
  description: "Commands the policy names wait for an operator's approval; every command is counted and shown.",
  register(api) {
    screen = { ...screen, ...(api.pluginConfig?.screen ?? {}) };
    api.on("before_tool_call", beforeExec, { matcher: ["exec"], priority: 1000, timeoutMs: HOOK_BUDGET });
    api.on("after_tool_call", afterExec, { matcher: ["exec"] });
  },
};

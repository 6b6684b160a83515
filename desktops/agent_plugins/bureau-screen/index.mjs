// Le Bureau's screen inside OpenClaw: the agent's tools to see and act on its desktop's own screen (`:0`,
// the one the operator watches), as anyone does with the control plane's screen API.
//
// Written into each desktop by the control plane (desktops/agent_config.py) and loaded by the gateway
// from `plugins.load.paths` when it starts. The tools call the guest endpoint with the desktop's token
// (`/v1/screen/screenshot`, `/v1/screen/actions`), which runs the same screen code as the API's
// screenshot and actions: over the desktop's VNC server, or its engine's console when that is down.
// A batch of actions is checked whole before any of it is done, and audited with the desktop as actor.
import { readFileSync } from "node:fs";
import { join } from "node:path";

// Where the desktop's credential for the control plane's guest endpoint, and its address, are written.
const BUREAU_CONFIG = process.env.BUREAU_CONFIG_DIR || "/etc/bureau";
// OpenClaw scales a tool's image down to 1200 pixels a side before a model sees it: asked no wider,
// the scale the control plane reports stays true of the image the model gets.
const MAX_WIDTH = 1200;
// A batch may wait 30 s, and the screenshot after it waits for the screen to settle.
const LOOK_TIMEOUT = 30_000;
const ACT_TIMEOUT = 90_000;
const ACTION_TYPES = ["move", "click", "drag", "scroll", "type", "key", "wait"];

function bureauSetting(name) {
  return readFileSync(join(BUREAU_CONFIG, name), "utf8").trim();
}

async function guest(path, { body, signal, timeout }) {
  const signals = [AbortSignal.timeout(timeout), ...(signal ? [signal] : [])];
  const answer = await fetch(`${bureauSetting("guest_url")}${path}`, {
    method: body ? "POST" : "GET",
    headers: { Authorization: `Bearer ${bureauSetting("token")}`, "Content-Type": "application/json" },
    body: body ? JSON.stringify(body) : undefined,
    signal: AbortSignal.any(signals),
  });
  const data = await answer.json().catch(() => ({}));
  if (!answer.ok) {
    // The control plane's own words: which action is wrong and why, or why the screen did not answer.
    throw new Error(data?.error?.message || `The screen API answered ${answer.status}.`);
  }
  return data;
}

function width(asked) {
  return Math.min(Number.isInteger(asked) && asked >= 16 ? asked : MAX_WIDTH, MAX_WIDTH);
}

// A screenshot as the model gets it: what maps its points back to the screen, then the image.
function shown(shot) {
  const text =
    `Screenshot ${shot.width}x${shot.height} of the ${shot.screenWidth}x${shot.screenHeight} screen, scale ` +
    `${shot.scale}: the point (x, y) of the image is (x / ${shot.scale}, y / ${shot.scale}) on the screen, ` +
    "and screen_act takes points of the screen.";
  return [
    { type: "text", text },
    { type: "image", data: shot.data, mimeType: shot.contentType },
  ];
}

function sizeOf(shot) {
  if (!shot) {
    return null;
  }
  const { width, height, scale, screenWidth, screenHeight } = shot;
  return { width, height, scale, screenWidth, screenHeight };
}

const look = {
  name: "screen_look",
  label: "Look at the screen",
  description:
    "Take a screenshot of your desktop's screen (the one your operator watches): what is open on it, " +
    "where to click. Returns the image and its scale to the screen.",
  // Its image must reach the model: a call through Tool Search's `tool_call` would answer text only.
  catalogMode: "direct-only",
  parameters: {
    type: "object",
    additionalProperties: false,
    properties: {
      width: {
        type: "integer",
        minimum: 16,
        maximum: MAX_WIDTH,
        description: `Scale the image down to this width (at most ${MAX_WIDTH}, the default).`,
      },
    },
  },
  async execute(_id, params, signal) {
    const shot = await guest(`/v1/screen/screenshot?width=${width(params?.width)}`, {
      signal,
      timeout: LOOK_TIMEOUT,
    });
    return { content: shown(shot), details: { screenshot: sizeOf(shot) } };
  },
};

const act = {
  name: "screen_act",
  label: "Act on the screen",
  description:
    "Use the mouse and keyboard on your desktop's screen (the one your operator watches): actions done " +
    "in order, in screen pixels (see screen_look's scale). move {x, y}; click {x, y, button?: left|middle|" +
    "right, double?}; drag {x, y, toX, toY, button?}; scroll {x, y, dx?, dy?} (wheel clicks, down and " +
    "right positive); type {text} (any Unicode, \\n for Enter); key {keys} (a combination: ctrl+l, " +
    "alt+F4, enter); wait {ms}. The whole batch is checked before any of it is done. With screenshot: " +
    "true, answers with a screenshot once the screen has settled.",
  catalogMode: "direct-only",
  parameters: {
    type: "object",
    additionalProperties: false,
    required: ["actions"],
    properties: {
      actions: {
        type: "array",
        minItems: 1,
        maxItems: 100,
        items: {
          type: "object",
          additionalProperties: false,
          required: ["type"],
          properties: {
            type: { type: "string", enum: ACTION_TYPES },
            x: { type: "integer", minimum: 0 },
            y: { type: "integer", minimum: 0 },
            toX: { type: "integer", minimum: 0, description: "Where a drag ends." },
            toY: { type: "integer", minimum: 0 },
            button: { type: "string", enum: ["left", "middle", "right"] },
            double: { type: "boolean", description: "A double click." },
            dx: { type: "integer", description: "Wheel clicks right." },
            dy: { type: "integer", description: "Wheel clicks down." },
            text: { type: "string", description: "Text to type." },
            keys: { type: "string", description: "A key combination: ctrl+l, alt+F4, enter." },
            ms: { type: "integer", minimum: 0, maximum: 10000, description: "A wait." },
          },
        },
      },
      screenshot: { type: "boolean", description: "Answer with a screenshot once the screen has settled." },
      width: { type: "integer", minimum: 16, maximum: MAX_WIDTH, description: "The screenshot's width." },
    },
  },
  async execute(_id, params, signal) {
    const body = {
      actions: params.actions,
      screenshot: Boolean(params.screenshot),
      width: width(params.width),
    };
    const done = await guest("/v1/screen/actions", { body, signal, timeout: ACT_TIMEOUT });
    const content = [{ type: "text", text: `Done: ${done.count} action(s).` }];
    if (done.screenshot) {
      content.push(...shown(done.screenshot));
    }
    return { content, details: { count: done.count, screenshot: sizeOf(done.screenshot) } };
  },
};

export default {
  id: "bureau-screen",
  name: "Le Bureau screen",
  description: "The agent sees and acts on its desktop's own screen.",
  register(api) {
    api.registerTool(look);
    api.registerTool(act);
  },
};

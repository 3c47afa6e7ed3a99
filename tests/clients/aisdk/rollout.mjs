// One tool-loop rollout with the Vercel AI SDK against a responses-lab server (tests/test_aisdk.py).
// Unmodified SDK code: createOpenAI({ baseURL, apiKey }) → openai.responses(model), generateText or
// streamText with one local tool, up to five steps. Prints one JSON line: the text, the steps' finish
// reasons, the tool calls made, and the usage the SDK summed (text: the last step's; streamed: every step's).
// Env: AISDK_MODULES (the installed node_modules), LAB_BASE_URL, LAB_API_KEY, LAB_MODEL, LAB_PROMPT,
//      LAB_STREAM ("1" → streamText), LAB_STORE ("true" / "false").
import { pathToFileURL } from "node:url";
import { join } from "node:path";

const modules = process.env.AISDK_MODULES;
const load = (name, file) => import(pathToFileURL(join(modules, name, "dist", file)).href);
const { generateText, streamText, tool, jsonSchema, stepCountIs } = await load("ai", "index.js");
const { createOpenAI } = await load("@ai-sdk/openai", "index.js");

const openai = createOpenAI({ baseURL: process.env.LAB_BASE_URL, apiKey: process.env.LAB_API_KEY });
const calls = [];
const tools = {
  grep: tool({
    description: "Search the repository.",
    inputSchema: jsonSchema({ type: "object", properties: { pattern: { type: "string" } }, required: ["pattern"], additionalProperties: false }),
    execute: async ({ pattern }) => {
      calls.push(pattern);
      return `3 matches for ${pattern}`;
    },
  }),
};
const options = {
  model: openai.responses(process.env.LAB_MODEL),
  prompt: process.env.LAB_PROMPT,
  tools,
  stopWhen: stepCountIs(5),
  providerOptions: { openai: { store: process.env.LAB_STORE === "true" } },
};

let text, steps, usage;
if (process.env.LAB_STREAM === "1") {
  const result = streamText(options);
  let streamed = "";
  for await (const delta of result.textStream) streamed += delta;
  [text, steps, usage] = [streamed, await result.steps, await result.totalUsage];
} else {
  const result = await generateText(options);
  [text, steps, usage] = [result.text, result.steps, result.totalUsage];
}
console.log(JSON.stringify({
  text: steps.at(-1).text,
  streamed: text,
  stepTexts: steps.map((step) => step.text).join(""),
  finishReasons: steps.map((step) => step.finishReason),
  responseIds: steps.map((step) => step.response?.id),
  calls,
  usage: { inputTokens: usage.inputTokens, outputTokens: usage.outputTokens },
}));

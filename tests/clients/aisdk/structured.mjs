// Structured output with the Vercel AI SDK against a responses-lab server (tests/test_aisdk.py).
// Unmodified SDK code: createOpenAI({ baseURL, apiKey }) → openai.responses(model), then generateText (or
// streamText) with `output: Output.object({ schema })` and a zod schema — AI SDK 7's structured output
// (its `generateObject` is deprecated in favour of this). The SDK sends the schema as `text.format`
// json_schema (strict) and parses and validates the reply against the zod schema itself: a reply that
// does not validate throws NoObjectGeneratedError and this script exits non-zero. Prints one JSON line:
// the object, the response id, and the JSON schema the SDK derived from the zod schema.
// Env: AISDK_MODULES, LAB_BASE_URL, LAB_API_KEY, LAB_MODEL, LAB_PROMPT, LAB_STREAM ("1" → streamText).
import { pathToFileURL } from "node:url";
import { join } from "node:path";

const modules = process.env.AISDK_MODULES;
const load = (name, file) => import(pathToFileURL(join(modules, name, file)).href);
const { generateText, streamText, Output } = await load("ai", "dist/index.js");
const { createOpenAI } = await load("@ai-sdk/openai", "dist/index.js");
const { z } = await load("zod", "index.js");

const Verdict = z.object({
  verdict: z.enum(["pass", "fail"]),
  lines: z.array(z.number().int().min(1).max(999)).min(1).max(3),
  note: z.string().max(40),
  retry: z.object({ needed: z.boolean(), after_s: z.number().min(0).max(60) }),
});
const openai = createOpenAI({ baseURL: process.env.LAB_BASE_URL, apiKey: process.env.LAB_API_KEY });
const options = {
  model: openai.responses(process.env.LAB_MODEL),
  prompt: process.env.LAB_PROMPT,
  output: Output.object({ schema: Verdict, name: "verdict" }),
};

let object, response, partials = 0;
if (process.env.LAB_STREAM === "1") {
  const result = streamText(options);
  for await (const _ of result.partialOutputStream) partials += 1;
  [object, response] = [await result.output, await result.response];
} else {
  const result = await generateText(options);
  [object, response] = [result.output, result.response];
}
console.log(JSON.stringify({
  object,
  valid: Verdict.safeParse(object).success,
  responseId: response.id,
  partials,
  schema: z.toJSONSchema(Verdict),
}));

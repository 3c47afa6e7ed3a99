// The OpenAI Agents SDK for JavaScript (@openai/agents, pinned in package.json), unmodified, driven by
// tests/test_agents_js.py: one case (LAB_CASE) against LAB_BASE_URL, over the Responses WebSocket when
// LAB_WEBSOCKET=1 (the provider's useResponsesWebSocket, which needs Node >= 22's global WebSocket: run
// with the node that package.json installs). Prints one JSON line of what the client did.
// AGENTS_MODULES: the installed node_modules (the Makefile's clients target), loaded by path.
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

const load = (file) => import(pathToFileURL(join(process.env.AGENTS_MODULES, file)).href);
const { Agent, OpenAIProvider, Runner, setTracingDisabled, tool } = await load('@openai/agents/dist/index.mjs');
const { z } = await load('zod/index.js');

setTracingDisabled(true); // no trace export: nothing leaves loopback

const TWO_TURNS =
  'Find the mean.\n!call grep {"pattern": "def mean"}\n!say Found it.\n' +
  '!call read_file {"path": "a.py"}\n!say Read it.';

const provider = new OpenAIProvider({
  apiKey: process.env.LAB_API_KEY,
  baseURL: process.env.LAB_BASE_URL,
  useResponses: true,
  useResponsesWebSocket: process.env.LAB_WEBSOCKET === '1',
});
const runner = new Runner({ modelProvider: provider, tracingDisabled: true });
const model = process.env.LAB_MODEL;
const calls = [];

const tools = [
  tool({
    name: 'grep',
    description: 'Search the code for a pattern.',
    parameters: z.object({ pattern: z.string() }),
    execute: async ({ pattern }) => {
      calls.push(`grep ${pattern}`);
      return `a.py:1: ${pattern}`;
    },
  }),
  tool({
    name: 'read_file',
    description: 'Read a file.',
    parameters: z.object({ path: z.string() }),
    execute: async ({ path }) => {
      calls.push(`read_file ${path}`);
      return `contents of ${path}`;
    },
  }),
];

const cases = {
  // A tool loop, then a second user turn chained to the first run's last response.
  async tool_loop() {
    const agent = new Agent({ name: 'finder', instructions: 'Be brief.', tools, model });
    const first = await runner.run(agent, TWO_TURNS);
    const second = await runner.run(agent, 'And the file?', { previousResponseId: first.lastResponseId });
    return { calls, answers: [first.finalOutput, second.finalOutput] };
  },
  // A streamed run: the text deltas of the model's stream events.
  async streamed() {
    const agent = new Agent({ name: 'finder', instructions: 'Be brief.', tools, model });
    const result = await runner.run(
      agent,
      'Look.\n!call grep {"pattern": "def median"}\n!say Streamed answer here.',
      { stream: true },
    );
    const deltas = [];
    for await (const event of result) {
      if (event.type === 'raw_model_stream_event' && event.data.type === 'output_text_delta') {
        deltas.push(event.data.delta);
      }
    }
    await result.completed;
    return { calls, deltas, answer: result.finalOutput };
  },
  // Structured output: a zod outputType, sent as text.format json_schema and parsed by the SDK.
  async structured() {
    const agent = new Agent({
      name: 'forecaster',
      instructions: 'Be brief.',
      outputType: z.object({ city: z.string(), celsius: z.number().int() }),
      model,
    });
    const result = await runner.run(agent, 'Weather?\n!json {"city": "Oslo", "celsius": -3}');
    return { object: result.finalOutput };
  },
};

try {
  const result = await cases[process.env.LAB_CASE]();
  console.log(JSON.stringify({ node: process.version, ...result }));
} finally {
  await provider.close(); // the socket would keep the process alive
}

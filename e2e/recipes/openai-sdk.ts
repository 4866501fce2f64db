// The OpenAI Node SDK (openai 6): include_metrics goes in the body through a
// cast to the params type (a @ts-expect-error would sit on a different line
// for each TypeScript version), and metrics is read after an `in` check.
import OpenAI from "openai";
import { baseURL, model, prompt, report } from "./run.js";

const client = new OpenAI({ baseURL, apiKey: "unused" });
const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: "user", content: prompt }];

const stream = await client.chat.completions.create({
  model, messages, stream: true, include_metrics: true,
} as OpenAI.ChatCompletionCreateParamsStreaming);
let streamed: unknown;
for await (const chunk of stream) {
  if ("metrics" in chunk) streamed = chunk.metrics; // the finishing chunk, or the usage chunk
}
const completion = await client.chat.completions.create({
  model, messages, include_metrics: true,
} as OpenAI.ChatCompletionCreateParamsNonStreaming);
const created = "metrics" in completion ? completion.metrics : undefined;

report("stream", streamed);
report("create", created);

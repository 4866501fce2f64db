// LangChain JS (@langchain/openai 1.5): modelKwargs sends include_metrics,
// but ChatOpenAI leaves metrics out of response_metadata. A non-streaming
// call reaches it through __includeRawResponse; a stream only through the
// HTTP layer: a fetch that tees the body and reads metrics from its data:
// lines. One request at a time: `metrics` and `reading` are the last one's.
import { ChatOpenAI } from "@langchain/openai";
import { baseURL, model, prompt, report } from "./run.js";

let metrics: unknown;
let reading = Promise.resolve();
const teeFetch: typeof fetch = async (input, init) => {
  const response = await fetch(input, init);
  if (!response.body) return response;
  const [mine, theirs] = response.body.tee();
  reading = new Response(mine).text().then((body) => {
    for (const line of body.split("\n")) {
      const data = line.startsWith("data:") ? line.slice(5).trim() : "";
      if (data && data !== "[DONE]") metrics = JSON.parse(data).metrics ?? metrics;
    }
  }).catch(() => {}); // an aborted request rejects here: uncaught, Node exits
  return new Response(theirs, response);
};
const chat = new ChatOpenAI({
  model, apiKey: "unused", configuration: { baseURL, fetch: teeFetch },
  modelKwargs: { include_metrics: true },
});
for await (const _ of await chat.stream(prompt)); // or use the chunks as they come
await reading; // the copy may end after LangChain's: read metrics after it
const streamed = metrics;

const raw = new ChatOpenAI({
  model, apiKey: "unused", configuration: { baseURL },
  modelKwargs: { include_metrics: true }, __includeRawResponse: true,
});
const message = await raw.invoke(prompt);
const invoked = (message.additional_kwargs.__raw_response as { metrics?: unknown }).metrics;

report("stream", streamed);
report("invoke", invoked);

// A stream its caller stops: the copy's read rejects with the abort, and
// without the catch above Node would exit here with code 1.
const stop = new AbortController();
try {
  for await (const _ of await chat.stream(prompt, { signal: stop.signal })) stop.abort();
} catch (e) {
  if (!stop.signal.aborted) throw e;
}
await reading;

// The Vercel AI SDK (ai 6, @ai-sdk/openai-compatible 2): @ai-sdk/openai drops
// unknown response fields, so the OpenAI-compatible provider with a
// metadataExtractor carries metrics into providerMetadata. The
// providerOptions key must equal the provider's name; the metadata must be
// JSONValue, so `metrics: unknown` fails `tsc --strict`.
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { generateText, streamText, type JSONValue } from "ai";
import { baseURL, model, prompt, report } from "./run.js";

const metricsOf = (body: unknown) => (body as { metrics?: JSONValue }).metrics;
const sidecar = createOpenAICompatible({
  name: "sidecar", baseURL,
  metadataExtractor: {
    extractMetadata: async ({ parsedBody }) => ({ sidecar: { metrics: metricsOf(parsedBody) } }),
    createStreamExtractor: () => {
      let metrics: JSONValue | undefined;
      return {
        processChunk: (chunk) => { metrics = metricsOf(chunk) ?? metrics; },
        buildMetadata: () => ({ sidecar: { metrics } }),
      };
    },
  },
});
const providerOptions = { sidecar: { include_metrics: true } };

const stream = streamText({ model: sidecar(model), prompt, providerOptions });
for await (const _ of stream.textStream); // or use the text as it comes
const streamed = (await stream.providerMetadata)?.sidecar?.metrics;
const result = await generateText({ model: sidecar(model), prompt, providerOptions });
const generated = result.providerMetadata?.sidecar?.metrics;

report("streamText", streamed);
report("generateText", generated);

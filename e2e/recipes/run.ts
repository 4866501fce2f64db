// What every recipe shares: where the sidecar is (SIDECAR_URL, default
// http://localhost:8001), which model to ask, and how a recipe reports the
// metrics object it read: one line "label {json}" on standard output, or a
// non-zero exit when it read none.
export const baseURL = (process.env.SIDECAR_URL ?? "http://localhost:8001") + "/v1";
export const model = process.env.MODEL ?? "emulated/llama-3.1-8b-instruct";
export const prompt = "Say hello.";

export function report(label: string, metrics: unknown): void {
  if (metrics === undefined || metrics === null) {
    console.error(`${label}: no metrics object`);
    process.exitCode = 1;
    return;
  }
  console.log(`${label} ${JSON.stringify(metrics)}`);
}

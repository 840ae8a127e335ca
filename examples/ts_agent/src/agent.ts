// An identity agent on the official `openai` npm package, with no tinkertrace code at all.
//
// Each rollout points the client's baseURL at the endpoint under a rollout prefix
// (`<endpoint>/rollouts/<rollout id>/task/<task id>/v1`); the endpoint records the call token-exact.
// The agent then posts its reward and its end over plain HTTP. Asked "Who are you?", it should answer
// "I am tinkertrace." (the same task and partial-credit reward as `tinkertrace demo`).
//
//   node dist/agent.js --endpoint http://127.0.0.1:8000 --model tinkertrace/tiny-chat --rounds 2
//
// Each round runs --group-size rollouts of one question at once (one GRPO group: one task id) and
// prints one JSON line per rollout. --rounds 0 runs until SIGTERM (after the current round).

import { randomUUID } from "node:crypto";
import { parseArgs } from "node:util";
import OpenAI from "openai";

const TARGET = "I am tinkertrace.";
const QUESTIONS = ["Who are you?", "What is your name?", "Introduce yourself.", "Identify yourself."];

interface Options {
  endpoint: string;
  model: string;
  apiKey: string;
  maxTokens: number;
}

/** Partial credit in [0, 1]: half for characters in the right place, half for the overlap of
 * character counts with the target. Exactly the target scores 1. */
export function identityReward(reply: string, target: string = TARGET): number {
  const text = reply.trim();
  let position = 0;
  for (let i = 0; i < Math.min(text.length, target.length); i++) if (text[i] === target[i]) position++;
  const have = new Map<string, number>();
  for (const c of text) have.set(c, (have.get(c) ?? 0) + 1);
  const want = new Map<string, number>();
  for (const c of target) want.set(c, (want.get(c) ?? 0) + 1);
  let overlap = 0;
  for (const [c, n] of want) overlap += Math.min(have.get(c) ?? 0, n);
  const score = (0.5 * position) / target.length + (0.5 * overlap) / Math.max(text.length, target.length);
  return Math.round(score * 1e6) / 1e6;
}

async function post(url: string, apiKey: string, body: object): Promise<void> {
  const answer = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${apiKey}` },
    body: JSON.stringify(body),
  });
  if (!answer.ok) throw new Error(`POST ${url}: ${answer.status} ${await answer.text()}`);
}

async function rollout(options: Options, taskId: string, question: string): Promise<object> {
  const rolloutId = randomUUID();
  const root = options.endpoint.replace(/\/$/, "");
  const client = new OpenAI({
    baseURL: `${root}/rollouts/${rolloutId}/task/${encodeURIComponent(taskId)}/v1`,
    apiKey: options.apiKey,
    maxRetries: 3,
  });
  const routes = `${root}/v1/rollouts/${rolloutId}`;
  try {
    const completion = await client.chat.completions.create({
      model: options.model,
      messages: [{ role: "user", content: question }],
      temperature: 1.0,
      max_tokens: options.maxTokens,
    });
    const reply = completion.choices[0]?.message.content ?? "";
    const reward = identityReward(reply);
    await post(`${routes}/reward`, options.apiKey, { value: reward, response_id: completion.id });
    await post(`${routes}/finish`, options.apiKey, { status: "succeeded" });
    return { rollout_id: rolloutId, task_id: taskId, reward, reply, response_id: completion.id };
  } catch (error) {
    await post(`${routes}/finish`, options.apiKey, { status: "failed" }).catch(() => undefined);
    return { rollout_id: rolloutId, task_id: taskId, error: String(error).slice(0, 300) };
  }
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      endpoint: { type: "string" },
      model: { type: "string", default: "tinkertrace/tiny-chat" },
      worker: { type: "string", default: "0" },
      "group-size": { type: "string", default: "4" },
      "max-tokens": { type: "string", default: "20" },
      rounds: { type: "string", default: "0" },
    },
  });
  if (!values.endpoint) throw new Error("--endpoint is required (the server root, e.g. http://127.0.0.1:8000)");
  const options: Options = {
    endpoint: values.endpoint,
    model: values.model ?? "tinkertrace/tiny-chat",
    apiKey: process.env.OPENAI_API_KEY ?? "unused",
    maxTokens: Number(values["max-tokens"]),
  };
  const worker = Number(values.worker);
  const groupSize = Number(values["group-size"]);
  const rounds = Number(values.rounds);
  let stopping = false;
  process.on("SIGTERM", () => {
    stopping = true;
  });
  for (let round = 0; !stopping && (rounds === 0 || round < rounds); round++) {
    const q = (worker + round) % QUESTIONS.length;
    const taskId = `ts-q${q}-w${worker}-r${round}`;
    const group = Array.from({ length: groupSize }, () => rollout(options, taskId, QUESTIONS[q]));
    for (const row of await Promise.all(group)) console.log(JSON.stringify({ worker, round, ...row }));
  }
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});

// The official `openai` package against `strata serve` (tests/openai_test.py
// runs this with node, the package installed into the build directory):
// the model list, a chat completion, the same streamed, and an unknown
// model's 404 as the client's NotFoundError.  Prints one JSON line.
const OpenAI = require('openai');

async function main() {
  const [port, key] = process.argv.slice(2);
  const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: key });
  const out = {};
  const models = await client.models.list();
  out.models = models.data.map((m) => m.id);
  const req = {
    model: out.models[0],
    messages: [{ role: 'system', content: 'You tell stories.' },
               { role: 'user', content: 'Tell me about Lily.' }],
    max_tokens: 24,
    temperature: 0,
  };
  const whole = await client.chat.completions.create(req);
  out.whole = whole.choices[0].message.content;
  out.finish = whole.choices[0].finish_reason;
  out.usage = whole.usage;
  const stream = await client.chat.completions.create({ ...req, stream: true });
  out.streamed = '';
  out.chunks = 0;
  for await (const chunk of stream) {
    out.chunks++;
    out.streamed += chunk.choices[0]?.delta?.content || '';
  }
  try {
    await client.chat.completions.create({ ...req, model: 'gpt-17' });
    out.notfound = 'no error';
  } catch (e) {
    out.notfound = e instanceof OpenAI.NotFoundError ? e.status : String(e);
  }
  console.log(JSON.stringify(out));
}

main().catch((e) => { console.error(String(e)); process.exit(1); });

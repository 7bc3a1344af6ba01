// dynask admin: the chat playground. Streams a reply from our own OpenAI endpoint with
// fetch and a ReadableStream, parsing its server-sent events as they arrive. A reply's
// reasoning (reasoning_content) and tool calls (delta.tool_calls) are shown apart from
// its text; tools to offer may be pasted as JSON.
"use strict";
(() => {
  const endpoint = document.currentScript.dataset.endpoint;
  const apiKey = document.currentScript.dataset.apiKey;  // short-lived, minted for this page
  const $ = (id) => document.getElementById(id);
  const log = $("chat-log"), input = $("chat-message"), status = $("chat-status");
  const submit = $("chat-submit");
  let messages = [];

  function bubble(role, text) {
    $("chat-empty")?.remove();
    const item = document.createElement("div");
    item.className = `bubble ${role}`;
    const who = document.createElement("div");
    who.className = "who";
    who.textContent = role === "user" ? "You" : $("chat-model").value;
    const reasoning = document.createElement("details");
    reasoning.className = "reasoning";
    reasoning.hidden = true;
    reasoning.innerHTML = "<summary>Reasoning</summary><div class=\"reasoning-text\"></div>";
    const body = document.createElement("div");
    body.className = "text";
    body.textContent = text;
    const calls = document.createElement("div");
    calls.className = "tool-calls";
    item.append(who, reasoning, body, calls);
    log.append(item);
    log.scrollTop = log.scrollHeight;
    return body;
  }

  // Calls onData(json) for each `data:` line of each complete event in the stream.
  async function readEvents(response, onData) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true }).replace(/\r\n/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        for (const line of event.split("\n")) {
          const data = line.startsWith("data:") ? line.slice(5).trim() : "";
          if (data && data !== "[DONE]") onData(JSON.parse(data));
        }
      }
    }
  }

  // The tools pasted in the controls (a JSON array of function tools), or undefined.
  function offeredTools() {
    const text = $("chat-tools").value.trim();
    if (!text) return undefined;
    const tools = JSON.parse(text);
    if (!Array.isArray(tools)) throw new Error("Tools must be a JSON array of function tools");
    return tools;
  }

  function showCalls(element, calls) {
    element.replaceChildren(...calls.map((call) => {
      const line = document.createElement("div");
      line.className = "tool-call";
      line.textContent = `tool call: ${call.function.name}(${call.function.arguments})`;
      return line;
    }));
  }

  async function send(text) {
    const model = $("chat-model").value;
    if (!model) { status.textContent = "No model is ready; create a deployment first."; return; }
    messages.push({ role: "user", content: text });
    bubble("user", text);
    const reply = bubble("assistant", "");
    reply.parentElement.classList.add("streaming");
    submit.disabled = true;
    status.textContent = "waiting for the first token…";
    const started = performance.now();
    let firstAt = null, chunks = 0, content = "", thinking = "";
    const calls = [];
    const reasoningBox = reply.parentElement.querySelector(".reasoning");
    const callsBox = reply.parentElement.querySelector(".tool-calls");
    try {
      const tools = offeredTools();
      const response = await fetch(endpoint, {
        method: "POST",
        headers: { "content-type": "application/json", authorization: `Bearer ${apiKey}` },
        body: JSON.stringify({
          model, messages, stream: true,
          max_tokens: Number($("chat-max-tokens").value) || 128,
          // Left empty, the server applies the model's default sampling settings.
          ...($("chat-temperature").value === "" ? {} : { temperature: Number($("chat-temperature").value) }),
          ...(tools ? { tools } : {}),
        }),
      });
      if (!response.ok) {
        const body = await response.json().catch(() => null);
        throw new Error(body?.error?.message || `HTTP ${response.status}`);
      }
      await readEvents(response, (chunk) => {
        if (chunk.error) throw new Error(chunk.error.message);
        const delta = chunk.choices?.[0]?.delta;
        if (!delta || !(delta.content || delta.reasoning_content || delta.tool_calls)) return;
        firstAt ??= performance.now();
        chunks += 1;
        if (delta.reasoning_content) {
          thinking += delta.reasoning_content;
          reasoningBox.hidden = false;
          reasoningBox.querySelector(".reasoning-text").textContent = thinking;
        }
        for (const piece of delta.tool_calls || []) {
          calls[piece.index] ??= { id: piece.id, type: "function", function: { name: "", arguments: "" } };
          const call = calls[piece.index].function;
          call.name = piece.function?.name || call.name;
          call.arguments += piece.function?.arguments || "";
        }
        if (delta.tool_calls) showCalls(callsBox, calls);
        content += delta.content || "";
        reply.textContent = content;
        log.scrollTop = log.scrollHeight;
        status.textContent = `streaming… ${chunks} chunks`;
      });
      messages.push(calls.length ? { role: "assistant", content, tool_calls: calls }
                                 : { role: "assistant", content });
      const ttft = firstAt === null ? "–" : `${Math.round(firstAt - started)} ms`;
      status.textContent = `done: ${chunks} chunks · first token after ${ttft} · ` +
        `${Math.round(performance.now() - started)} ms in all`;
    } catch (error) {
      messages.pop();
      reply.parentElement.classList.add("error");
      reply.textContent = content + (content ? "\n" : "") + `⚠ ${error.message}`;
      status.textContent = "the request failed";
    } finally {
      reply.parentElement.classList.remove("streaming");
      submit.disabled = false;
    }
  }

  $("chat-send").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = input.value.trim();
    if (!text || submit.disabled) return;
    input.value = "";
    send(text);
  });
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      event.preventDefault();
      $("chat-send").requestSubmit();
    }
  });
  $("chat-clear").addEventListener("click", () => {
    messages = [];
    log.replaceChildren();
    status.textContent = "";
  });
})();

// gguflm's chat page. It talks only to this server's OpenAI endpoints (/v1/models,
// /v1/chat/completions streamed as Server-Sent Events) and to /health. Conversations and
// settings live in localStorage. Model output becomes DOM nodes through textContent and
// createElement only, never through an HTML parser, so no reply can run as markup or script
// (and the server's Content-Security-Policy would block inline script if one ever did).

const STORE = {
  conversations: 'gguflm.conversations',
  current: 'gguflm.current',
  settings: 'gguflm.settings',
  apiKey: 'gguflm.apiKey',
};
// Sampling defaults are llama.cpp's; empty fields are left out of the request.
const DEFAULTS = {temperature: '0.8', top_p: '0.95', max_tokens: '', seed: ''};
const FIELDS = {temperature: 'number', top_p: 'number', max_tokens: 'integer', seed: 'integer'};
const HEALTH_EVERY_MS = 5000;
const SAVE_EVERY_MS = 500; // while a reply streams, so a reload keeps most of it

const MSG = {
  unreachable: 'Cannot reach the server: is gguflm serve still running?',
  lost: 'The connection to the server was lost before the reply ended; the part received ' +
        'is kept.',
  busy: 'The server is busy: all its slots are in use. Try again in a moment.',
  key: 'The server needs an API key: enter it, then press Retry.',
  badKey: 'The server refused the API key: enter the right one, then press Retry.',
};

const $ = (id) => document.getElementById(id);

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

// --- Markdown -----------------------------------------------------------------------------
// A small CommonMark subset (fenced code, headings, lists, quotes, tables, rules, emphasis,
// code spans, links). Everything it emits is built node by node; text is set with
// textContent, and links keep only http(s) and mailto targets.

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([\w+#.-]*)/;
const HEADING = /^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$/;
const RULE = /^ {0,3}([-*_])(?:\s*\1){2,}\s*$/;
const QUOTE = /^ {0,3}> ?(.*)$/;
const ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
const TABLE_RULE = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;

export function renderMarkdown(text) {
  const fragment = document.createDocumentFragment();
  renderBlocks(String(text).replace(/\r\n?/g, '\n').split('\n'), fragment);
  return fragment;
}

const indentOf = (line) => line.length - line.trimStart().length;
const isOrdered = (marker) => /\d/.test(marker);

function isTableStart(lines, i) {
  return lines[i].includes('|') && i + 1 < lines.length && lines[i + 1].includes('-') &&
    TABLE_RULE.test(lines[i + 1]);
}

function startsBlock(lines, i) {
  const line = lines[i];
  return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) ||
    ITEM.test(line) || isTableStart(lines, i);
}

function renderBlocks(lines, parent) {
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    let m;
    if (!line.trim()) {
      i++;
    } else if ((m = FENCE.exec(line))) {
      // up to the closing fence; a fence still open (a reply mid-stream) runs to the end
      const fence = m[1];
      const body = [];
      for (i++; i < lines.length; i++) {
        const t = lines[i].trim();
        if (t.length >= fence.length && [...t].every((c) => c === fence[0])) { i++; break; }
        body.push(lines[i]);
      }
      parent.append(codeBlock(body.join('\n'), m[2]));
    } else if ((m = HEADING.exec(line))) {
      const h = el('h' + m[1].length);
      renderInline(m[2], h);
      parent.append(h);
      i++;
    } else if (RULE.test(line)) {
      parent.append(el('hr'));
      i++;
    } else if (QUOTE.test(line)) {
      const quoted = [];
      while (i < lines.length && (m = QUOTE.exec(lines[i]))) { quoted.push(m[1]); i++; }
      const q = el('blockquote');
      renderBlocks(quoted, q);
      parent.append(q);
    } else if (ITEM.test(line)) {
      i = renderList(lines, i, parent);
    } else if (isTableStart(lines, i)) {
      i = renderTable(lines, i, parent);
    } else {
      const para = [line.trim()];
      for (i++; i < lines.length && lines[i].trim() && !startsBlock(lines, i); i++) {
        para.push(lines[i].trim());
      }
      const p = el('p');
      renderInline(para.join('\n'), p);
      parent.append(p);
    }
  }
}

function renderList(lines, i, parent) {
  const first = ITEM.exec(lines[i]);
  const ordered = isOrdered(first[2]);
  const base = first[1].length;
  const list = el(ordered ? 'ol' : 'ul');
  const start = parseInt(first[2], 10);
  if (ordered && start !== 1) list.start = start;
  let itemLines = null;
  const flush = () => {
    if (!itemLines) return;
    const li = el('li');
    renderBlocks(itemLines, li);
    list.append(li);
  };
  while (i < lines.length) {
    const line = lines[i];
    const m = ITEM.exec(line);
    const indent = indentOf(line);
    if (m && indent <= base + 1 && isOrdered(m[2]) === ordered) { // a sibling item
      flush();
      itemLines = [m[3]];
    } else if (!line.trim()) {
      // a blank line ends the list unless an indented line or a sibling item follows
      let j = i + 1;
      while (j < lines.length && !lines[j].trim()) j++;
      const next = j < lines.length ? lines[j] : null;
      const nm = next === null ? null : ITEM.exec(next);
      const goesOn = next !== null && (indentOf(next) > base ||
        (nm && indentOf(next) <= base + 1 && isOrdered(nm[2]) === ordered));
      if (!goesOn) break;
      itemLines.push('');
    } else if (indent > base) { // the item's own lines, nested lists included
      itemLines.push(line.slice(Math.min(indent, base + first[2].length + 1)));
    } else if (!startsBlock(lines, i)) { // a paragraph's lazy continuation
      itemLines.push(line);
    } else {
      break;
    }
    i++;
  }
  flush();
  parent.append(list);
  return i;
}

function tableCells(line) {
  let s = line.trim();
  if (s.startsWith('|')) s = s.slice(1);
  if (s.endsWith('|') && !s.endsWith('\\|')) s = s.slice(0, -1);
  return s.split(/(?<!\\)\|/).map((c) => c.trim().replace(/\\\|/g, '|'));
}

function renderTable(lines, i, parent) {
  const align = tableCells(lines[i + 1]).map((c) =>
    c.startsWith(':') && c.endsWith(':') ? 'center' : c.endsWith(':') ? 'right' : '');
  const row = (cells, tag) => {
    const tr = el('tr');
    cells.forEach((cell, k) => {
      const td = el(tag);
      if (align[k]) td.style.textAlign = align[k];
      renderInline(cell, td);
      tr.append(td);
    });
    return tr;
  };
  const table = el('table');
  const head = el('thead');
  head.append(row(tableCells(lines[i]), 'th'));
  const body = el('tbody');
  for (i += 2; i < lines.length && lines[i].trim() && lines[i].includes('|'); i++) {
    body.append(row(tableCells(lines[i]), 'td'));
  }
  table.append(head, body);
  const wrap = el('div', 'table-wrap');
  wrap.append(table);
  parent.append(wrap);
  return i;
}

function codeBlock(code, lang) {
  const wrap = el('div', 'code-block');
  const bar = el('div', 'code-bar');
  const copy = el('button', 'copy', 'Copy');
  copy.type = 'button';
  bar.append(el('span', 'lang', lang || 'code'), copy);
  const pre = el('pre');
  pre.append(el('code', null, code));
  wrap.append(bar, pre);
  return wrap;
}

// One pass over the text: the earliest of these wins; the text between matches stays text.
// Groups: 1 escaped char; 2-3 code span; 4-5 link; 6 strong; 7 strong (__); 8 em; 9 em (_);
// 10 strikethrough; 11 bare URL.
// Every span is bounded (SPAN characters): an unbounded lazy scan runs to the end of the
// text from each opener that never closes ('**a **a **a ...': square in the text, per render).
const SPAN = 300;
const LINK = 200; // a link's text: what follows each '[' (a common character) is scanned
const INLINE = new RegExp([
  /\\([\\`*_{}[\]()#+\-.!~|<>])/.source,
  `(\`+)([^\`]|[^\`][\\s\\S]{0,${SPAN}}?[^\`])\\2(?!\`)`,
  `\\[([^\\]\\n]{1,${LINK}})\\]\\(\\s*<?([^\\s<>()]{0,2048})>?(?:\\s+"[^"\\n]{0,${LINK}}")?\\s*\\)`,
  `\\*\\*(?!\\s)([\\s\\S]{0,${SPAN}}?\\S)\\*\\*`,
  `(?<!\\w)__(?!\\s)([\\s\\S]{0,${SPAN}}?\\S)__(?!\\w)`,
  `\\*(?![\\s*])([^*\\n]{0,${SPAN}}?[^\\s*])\\*`,
  `(?<!\\w)_(?![\\s_])([^_\\n]{0,${SPAN}}?[^\\s_])_(?!\\w)`,
  `~~(?!\\s)([\\s\\S]{0,${SPAN}}?\\S)~~`,
  /(https?:\/\/[^\s<>"'`]*[^\s<>"'`.,;:!?)\]}*_])/.source,
].join('|'), 'g');

function safeHref(url) {
  if (!/^(https?:\/\/|mailto:)/i.test(url)) return null;
  try {
    const parsed = new URL(url);
    return ['http:', 'https:', 'mailto:'].includes(parsed.protocol) ? parsed.href : null;
  } catch {
    return null;
  }
}

function link(href, renderText) {
  const a = el('a');
  a.href = href;
  a.target = '_blank';
  a.rel = 'noopener noreferrer nofollow';
  renderText(a);
  return a;
}

function renderInline(text, parent) {
  let last = 0;
  INLINE.lastIndex = 0;
  for (let m; (m = INLINE.exec(text));) {
    const end = INLINE.lastIndex; // nested calls below reuse INLINE
    if (m.index > last) parent.append(text.slice(last, m.index));
    let node;
    if (m[1] !== undefined) {
      node = m[1];
    } else if (m[3] !== undefined) {
      node = el('code', null, m[3].length > 2 && m[3].startsWith(' ') && m[3].endsWith(' ')
        ? m[3].slice(1, -1) : m[3]);
    } else if (m[4] !== undefined) {
      const href = safeHref(m[5]);
      node = href ? link(href, (a) => renderInline(m[4], a)) : m[0]; // unsafe: shown as text
    } else if (m[11] !== undefined) {
      const href = safeHref(m[11]);
      node = href ? link(href, (a) => a.append(m[11])) : m[11];
    } else {
      const [tag, inner] = m[6] !== undefined ? ['strong', m[6]] : m[7] !== undefined
        ? ['strong', m[7]] : m[8] !== undefined ? ['em', m[8]] : m[9] !== undefined
          ? ['em', m[9]] : ['del', m[10]];
      node = el(tag);
      renderInline(inner, node);
    }
    parent.append(node);
    last = end;
    INLINE.lastIndex = end;
  }
  if (last < text.length) parent.append(text.slice(last));
}

// --- storage --------------------------------------------------------------------------------

function load(key, fallback) {
  try {
    const raw = localStorage.getItem(key);
    return raw === null ? fallback : JSON.parse(raw);
  } catch {
    return fallback;
  }
}

let storageWarned = false;
function store(key, value) {
  try {
    localStorage.setItem(key, JSON.stringify(value));
    if (storageWarned) { storageWarned = false; showBanner(''); }
  } catch (e) {
    storageWarned = true;
    showBanner(`This browser would not save the conversations (${e.name}): delete old ` +
               'ones to make room.');
  }
}

const newId = () => Date.now().toString(36) + Math.random().toString(36).slice(2, 8);

// Anything in storage may be stale or edited by hand: keep only well-formed entries.
function cleanConversation(c) {
  if (!c || typeof c.id !== 'string' || !Array.isArray(c.messages)) return null;
  const messages = c.messages.filter((m) => m && ['user', 'assistant'].includes(m.role) &&
    typeof m.content === 'string').map((m) => ({...m, id: String(m.id || newId())}));
  return {id: c.id, title: String(c.title || 'New chat'),
    system: typeof c.system === 'string' ? c.system : '', messages,
    updated: Number(c.updated) || 0};
}

// --- state ----------------------------------------------------------------------------------

const state = {
  conversations: [],
  currentId: null,
  settings: {...DEFAULTS},
  apiKey: '',
  model: null, // {id, nCtx}
  active: null, // the reply streaming now: {conv, msg, controller}
  online: null,
  needKey: false, // the server refused the key (or none was given): wait for one
};

const current = () => state.conversations.find((c) => c.id === state.currentId);

function saveConversations() {
  store(STORE.conversations, state.conversations);
  store(STORE.current, state.currentId);
}

function newConversation(system = '') {
  const conv = {id: newId(), title: 'New chat', system, messages: [], updated: Date.now()};
  state.conversations.unshift(conv);
  state.currentId = conv.id;
  saveConversations();
  return conv;
}

function titleFor(text) {
  const line = text.trim().split('\n')[0];
  return line.length > 48 ? line.slice(0, 47) + '\u2026' : line || 'New chat';
}

// --- talking to the server ------------------------------------------------------------------

function api(path, options = {}) {
  const headers = {...(options.headers || {})};
  if (options.body) headers['Content-Type'] = 'application/json';
  if (state.apiKey) headers.Authorization = 'Bearer ' + state.apiKey;
  return fetch(path, {...options, headers, cache: 'no-store'});
}

function errorText(error) {
  if (typeof error === 'string') return error;
  if (error && typeof error.message === 'string') return error.message;
  return JSON.stringify(error);
}

class ReplyError extends Error {}

async function httpError(response) {
  let detail = '';
  try { detail = errorText((await response.json()).error); } catch { /* not JSON */ }
  if (response.status === 401) {
    const refused = Boolean(state.apiKey);
    askForKey(refused);
    return refused ? MSG.badKey : MSG.key;
  }
  if (response.status === 503) return MSG.busy + (detail ? ` (${detail})` : '');
  return `The server answered ${response.status}: ${detail || response.statusText}`;
}

// Server-Sent Events: yields each event's data, up to the end of the body.
async function* sseData(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  try {
    for (;;) {
      const {value, done} = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, {stream: true});
      const events = buffer.split(/\r?\n\r?\n/);
      buffer = events.pop();
      for (const event of events) {
        const data = event.split(/\r?\n/).filter((l) => l.startsWith('data:'))
          .map((l) => l.slice(5).replace(/^ /, '')).join('\n');
        if (data) yield data;
      }
    }
  } finally {
    reader.releaseLock();
  }
}

function requestBody(conv, reply) {
  const messages = [];
  if (conv.system.trim()) messages.push({role: 'system', content: conv.system});
  for (const m of conv.messages) {
    if (m === reply) break;
    if (m.role === 'assistant' && !m.content) continue; // a failed reply
    messages.push({role: m.role, content: m.content});
  }
  const body = {messages, stream: true, stream_options: {include_usage: true}};
  if (state.model) body.model = state.model.id;
  for (const [name, kind] of Object.entries(FIELDS)) {
    const raw = String(state.settings[name] ?? '').trim();
    if (!raw) continue;
    const value = Number(raw);
    if (Number.isFinite(value) && (kind === 'number' || Number.isInteger(value))) {
      body[name] = value;
    }
  }
  return body;
}

async function streamReply(conv, msg) {
  const controller = new AbortController();
  state.active = {conv, msg, controller};
  Object.assign(msg, {content: '', reasoning: undefined, error: undefined, stats: undefined,
                     streaming: true});
  conv.updated = Date.now();
  renderAll();
  const t0 = performance.now();
  let first = null;
  let lastPiece = null;
  let pieces = 0;
  let usage = null;
  let timings = null;
  let finish = null;
  let lastSave = 0;
  try {
    let response;
    try {
      response = await api('/v1/chat/completions',
        {method: 'POST', body: JSON.stringify(requestBody(conv, msg)),
          signal: controller.signal});
    } catch (e) {
      if (controller.signal.aborted) throw e;
      setOnline(false);
      throw new ReplyError(MSG.unreachable);
    }
    if (!response.ok) throw new ReplyError(await httpError(response));
    setOnline(true);
    let done = false;
    for await (const data of sseData(response)) {
      if (data === '[DONE]') { done = true; break; }
      let chunk;
      try { chunk = JSON.parse(data); } catch { continue; }
      if (chunk.error) throw new ReplyError('The server stopped the reply: ' +
                                            errorText(chunk.error));
      const choice = (chunk.choices || [])[0];
      const delta = (choice && choice.delta) || {};
      if (delta.reasoning_content) { // a reasoning model's thinking, shown folded
        msg.reasoning = (msg.reasoning || '') + delta.reasoning_content;
        updateMessage(conv, msg);
      }
      const piece = delta.content;
      if (piece) {
        msg.content += piece;
        pieces++;
        lastPiece = performance.now();
        if (first === null) first = lastPiece;
        updateMessage(conv, msg);
        if (lastPiece - lastSave > SAVE_EVERY_MS) { lastSave = lastPiece; saveConversations(); }
      }
      if (choice && choice.finish_reason) finish = choice.finish_reason;
      if (chunk.usage) usage = chunk.usage;
      if (chunk.timings) timings = chunk.timings; // llama.cpp's server adds these
    }
    if (!done) throw new ReplyError(MSG.lost);
  } catch (e) {
    if (controller.signal.aborted) {
      finish = 'stopped';
    } else if (e instanceof ReplyError) {
      msg.error = e.message;
    } else { // the body broke off (TypeError: network error)
      setOnline(false);
      msg.error = msg.content ? MSG.lost : MSG.unreachable;
    }
  } finally {
    const completion = usage ? usage.completion_tokens : pieces;
    let perSecond = timings && timings.predicted_per_second;
    if (!perSecond && first !== null && lastPiece > first && completion > 1) {
      perSecond = (completion - 1) / ((lastPiece - first) / 1000);
    }
    msg.stats = {
      prompt: usage ? usage.prompt_tokens : null,
      cached: usage && usage.prompt_tokens_details
        ? usage.prompt_tokens_details.cached_tokens : null,
      completion, exact: Boolean(usage), perSecond: perSecond || null,
      firstMs: first === null ? null : Math.round(first - t0),
      finish: msg.error ? 'error' : finish || 'unknown',
    };
    delete msg.streaming;
    state.active = null;
    conv.updated = Date.now();
    saveConversations();
    renderAll();
  }
}

function send() {
  const input = $('input');
  const text = input.value;
  if (!text.trim() || state.active) return;
  const conv = current() || newConversation();
  // a reply that failed before any text would leave two user turns in a row: drop it
  const last = conv.messages[conv.messages.length - 1];
  if (last && last.role === 'assistant' && !last.content && last.error) conv.messages.pop();
  if (!conv.messages.length) conv.title = titleFor(text);
  conv.messages.push({id: newId(), role: 'user', content: text});
  const reply = {id: newId(), role: 'assistant', content: ''};
  conv.messages.push(reply);
  input.value = '';
  autoGrow();
  streamReply(conv, reply);
}

function regenerate() {
  const conv = current();
  if (!conv || state.active) return;
  const last = conv.messages[conv.messages.length - 1];
  if (!last) return;
  let reply = last;
  if (last.role === 'user') { // no reply yet (it was deleted): make one
    reply = {id: newId(), role: 'assistant', content: ''};
    conv.messages.push(reply);
  }
  streamReply(conv, reply);
}

function stop() {
  if (state.active) state.active.controller.abort();
}

async function refreshModel() {
  try {
    const response = await api('/v1/models');
    if (response.status === 401) {
      setOnline(true);
      state.model = null;
      $('model-name').textContent = 'API key needed';
      $('model-ctx').textContent = '';
      askForKey(Boolean(state.apiKey));
      return;
    }
    if (!response.ok) throw new Error(await httpError(response));
    const data = await response.json();
    const model = (data.data || [])[0];
    if (!model) throw new Error('the server lists no model');
    const meta = model.meta || {};
    state.model = {id: String(model.id), nCtx: meta.n_ctx || model.n_ctx || null};
    setOnline(true);
    renderModel();
  } catch {
    setOnline(false);
  }
}

// /health says whether the server is there; any answer means it is (a 503 may mean busy
// or still loading), and its fields beyond that (slots...) are not needed here.
async function pollHealth() {
  try {
    const response = await fetch('/health', {cache: 'no-store'});
    setOnline(true, response.ok ? '' : `health: ${response.status} ${response.statusText}`);
    if (response.ok && !state.model && !state.needKey) await refreshModel();
  } catch {
    setOnline(false);
  }
}

// --- rendering ------------------------------------------------------------------------------

function showBanner(text) {
  const banner = $('banner');
  banner.textContent = text;
  banner.hidden = !text;
}

function setOnline(online, note = '') {
  state.online = online;
  $('status-dot').className = 'dot ' + (online ? 'online' : 'offline');
  $('status-text').textContent = online ? note : 'server unreachable';
}

function renderModel() {
  if (!state.model) return;
  $('model-name').textContent = state.model.id;
  $('model-ctx').textContent = state.model.nCtx ? `context ${state.model.nCtx} tokens` : '';
  document.title = `${state.model.id} \u00b7 gguflm chat`;
}

function statsText(stats) {
  const parts = [];
  if (stats.prompt !== null && stats.prompt !== undefined) {
    parts.push(`prompt ${stats.prompt} tokens` + (stats.cached ? ` (${stats.cached} cached)` : ''));
  }
  parts.push(`${stats.exact ? '' : '~'}${stats.completion} tokens`);
  if (stats.perSecond) parts.push(`${stats.perSecond.toFixed(1)} tokens/s`);
  parts.push(`finish: ${stats.finish}`);
  return parts.join(' \u00b7 ');
}

function messageElement(conv, msg, isLast) {
  const node = el('article', 'msg ' + msg.role);
  node.dataset.id = msg.id;
  node.append(el('div', 'role', msg.role === 'user' ? 'You' : 'Assistant'));
  const content = el('div', msg.role === 'user' ? 'content plain' : 'content md');
  node.append(content);
  if (msg.role === 'assistant') {
    fillReply(node, msg);
    if (isLast && !msg.streaming) {
      const actions = el('div', 'actions');
      const again = el('button', 'regenerate', msg.error ? 'Retry' : 'Regenerate');
      again.type = 'button';
      actions.append(again);
      node.append(actions);
    }
  } else {
    content.textContent = msg.content;
  }
  return node;
}

function fillReply(node, msg) {
  const content = node.querySelector('.content');
  let fold = node.querySelector('details.reasoning');
  if (msg.reasoning && !fold) { // the thinking, folded above the answer
    fold = el('details', 'reasoning');
    fold.append(el('summary', '', 'Reasoning'), el('div', 'reasoning-text'));
    content.before(fold);
  }
  if (fold) {
    fold.querySelector('.reasoning-text').textContent = msg.reasoning || '';
    fold.hidden = !msg.reasoning;
    fold.querySelector('summary').textContent =
      msg.streaming && !msg.content ? 'Reasoning\u2026' : 'Reasoning';
  }
  content.replaceChildren(renderMarkdown(msg.content));
  node.classList.toggle('streaming', Boolean(msg.streaming));
  let error = node.querySelector('.error');
  if (msg.error && !error) {
    error = el('div', 'error');
    error.setAttribute('role', 'alert');
    content.after(error);
  }
  if (error) {
    error.textContent = msg.error || '';
    error.hidden = !msg.error;
  }
  let stats = node.querySelector('.stats');
  if (msg.stats && !stats) {
    stats = el('div', 'stats');
    node.append(stats);
  }
  if (stats) stats.textContent = msg.stats ? statsText(msg.stats) : '';
}

// While a reply streams only its own node is redrawn, at most once a frame, and with at
// least twice the last redraw's time between redraws: a long reply then costs the page a
// bounded share of its time, however many pieces arrive.
let pendingUpdate = null;
let lastRenderMs = 0;
function updateMessage(conv, msg) {
  if (pendingUpdate) return;
  pendingUpdate = setTimeout(() => {
    pendingUpdate = null;
    if (conv.id !== state.currentId) return;
    const node = document.querySelector(`.msg[data-id="${CSS.escape(msg.id)}"]`);
    if (!node) return;
    const box = $('chat');
    const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
    const t0 = performance.now();
    fillReply(node, msg);
    lastRenderMs = performance.now() - t0;
    if (atBottom) box.scrollTop = box.scrollHeight;
  }, Math.max(16, 2 * lastRenderMs));
}

function renderConversationList() {
  const list = $('conversations');
  list.replaceChildren();
  const sorted = [...state.conversations].sort((a, b) => b.updated - a.updated);
  for (const conv of sorted) {
    const li = el('li');
    li.dataset.id = conv.id;
    if (conv.id === state.currentId) li.className = 'current';
    const open = el('button', 'open', conv.title);
    open.type = 'button';
    open.title = conv.title;
    const del = el('button', 'icon delete', '\u00d7');
    del.type = 'button';
    del.setAttribute('aria-label', 'Delete this conversation');
    li.append(open, del);
    list.append(li);
  }
}

function renderMessages() {
  const conv = current();
  const box = $('messages');
  box.replaceChildren();
  const messages = conv ? conv.messages : [];
  messages.forEach((m, k) => box.append(messageElement(conv, m, k === messages.length - 1)));
  $('empty-hint').hidden = messages.length > 0;
  $('system-prompt').value = conv ? conv.system : '';
  renderSystemPreview();
  const chat = $('chat');
  chat.scrollTop = chat.scrollHeight;
}

function renderSystemPreview() {
  const text = $('system-prompt').value.trim().split('\n')[0];
  $('system-preview').textContent = text ? ': ' + text : ': none';
}

function renderComposer() {
  const busy = Boolean(state.active);
  $('send').hidden = busy;
  $('stop').hidden = !busy;
}

function renderAll() {
  renderConversationList();
  renderMessages();
  renderComposer();
}

function autoGrow() {
  const input = $('input');
  input.style.height = 'auto';
  input.style.height = Math.min(input.scrollHeight + 2, 200) + 'px';
}

// --- panels, settings and the API key -------------------------------------------------------

function togglePanel(id, open) {
  const panel = $(id);
  const show = open === undefined ? !panel.classList.contains('open') : open;
  panel.classList.toggle('open', show);
  document.body.classList.toggle(id + '-open', show);
}

function loadSettings() {
  const saved = load(STORE.settings, {});
  state.settings = {...DEFAULTS};
  for (const name of Object.keys(FIELDS)) {
    if (saved && typeof saved[name] === 'string') state.settings[name] = saved[name];
  }
  for (const name of Object.keys(FIELDS)) $(name).value = state.settings[name];
}

function askForKey(refused) {
  state.needKey = true;
  const dialog = $('key-dialog');
  $('key-message').textContent = refused
    ? 'The server refused this API key. Enter the right one.'
    : 'This server was started with --api-key. Enter the key to use it.';
  if (dialog.open) return; // leave what the person is typing alone
  $('key-input').value = '';
  dialog.showModal();
}

function setApiKey(key) {
  state.needKey = false;
  state.apiKey = key.trim();
  if (state.apiKey) store(STORE.apiKey, state.apiKey);
  else localStorage.removeItem(STORE.apiKey);
  $('api-key').value = state.apiKey;
  refreshModel();
}

// --- wiring ---------------------------------------------------------------------------------

function init() {
  state.conversations = (load(STORE.conversations, []) || [])
    .map(cleanConversation).filter(Boolean);
  state.currentId = load(STORE.current, null);
  // a reply cut short by a reload is finished as it stands
  for (const conv of state.conversations) {
    for (const m of conv.messages) {
      if (m.streaming) { delete m.streaming; m.error = m.error || MSG.lost; }
    }
  }
  if (!current()) {
    if (state.conversations.length) state.currentId = state.conversations[0].id;
    else newConversation();
  }
  state.apiKey = load(STORE.apiKey, '') || '';
  $('api-key').value = state.apiKey;
  loadSettings();
  renderAll();

  $('composer').addEventListener('submit', (e) => { e.preventDefault(); send(); });
  $('input').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
    if (e.key === 'Escape') stop();
  });
  $('input').addEventListener('input', autoGrow);
  $('stop').addEventListener('click', stop);
  $('new-chat').addEventListener('click', () => {
    const conv = current();
    if (!conv || conv.messages.length) newConversation(conv ? conv.system : '');
    renderAll();
    togglePanel('sidebar', false);
    $('input').focus();
  });
  $('conversations').addEventListener('click', (e) => {
    const li = e.target.closest('li');
    if (!li) return;
    const id = li.dataset.id;
    if (e.target.closest('.delete')) {
      if (state.active && state.active.conv.id === id) stop();
      state.conversations = state.conversations.filter((c) => c.id !== id);
      if (state.currentId === id) {
        state.currentId = state.conversations.length ? state.conversations[0].id : null;
        if (!state.currentId) newConversation();
      }
      saveConversations();
    } else {
      state.currentId = id;
      store(STORE.current, id);
      togglePanel('sidebar', false);
    }
    renderAll();
  });
  $('messages').addEventListener('click', (e) => {
    if (e.target.closest('.regenerate')) regenerate();
    const copy = e.target.closest('.copy');
    if (copy) {
      const code = copy.closest('.code-block').querySelector('code').textContent;
      navigator.clipboard.writeText(code).then(() => { copy.textContent = 'Copied'; },
        () => { copy.textContent = 'Copy failed'; });
    }
  });
  $('system-prompt').addEventListener('input', () => {
    const conv = current();
    if (conv) { conv.system = $('system-prompt').value; saveConversations(); }
    renderSystemPreview();
  });
  for (const name of Object.keys(FIELDS)) {
    $(name).addEventListener('input', () => {
      state.settings[name] = $(name).value;
      store(STORE.settings, state.settings);
    });
  }
  $('reset-settings').addEventListener('click', () => {
    store(STORE.settings, {...DEFAULTS});
    loadSettings();
  });
  $('settings-form').addEventListener('submit', (e) => e.preventDefault());
  $('api-key').addEventListener('change', () => setApiKey($('api-key').value));
  $('key-form').addEventListener('submit', () => setApiKey($('key-input').value));
  $('toggle-sidebar').addEventListener('click', () => togglePanel('sidebar'));
  $('toggle-settings').addEventListener('click', () => togglePanel('settings'));
  for (const button of document.querySelectorAll('.close-panel')) {
    button.addEventListener('click', () => togglePanel(button.dataset.panel, false));
  }
  // another tab changed the conversations: show them (never while this tab streams)
  window.addEventListener('storage', (e) => {
    if (e.key !== STORE.conversations || state.active) return;
    state.conversations = (load(STORE.conversations, []) || [])
      .map(cleanConversation).filter(Boolean);
    if (!current()) state.currentId = state.conversations[0] ? state.conversations[0].id : null;
    if (!current()) newConversation();
    renderAll();
  });

  refreshModel();
  setInterval(pollHealth, HEALTH_EVERY_MS);
  $('input').focus();
}

// for the browser tests, which check the renderer on hostile input directly
window.gguflm = {renderMarkdown};

init();

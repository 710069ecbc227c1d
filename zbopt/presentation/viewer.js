// zbopt's report viewer: each schedule's Gantt chart and memory timeline drawn on canvases from the
// data the report embeds (gzip, base64: DecompressionStream unpacks it), with hover details, zoom
// (Ctrl + wheel, around the pointer; a plain wheel scrolls the page), pan (drag) and reset (double
// click); a click on a row of the comparison table shows that schedule. Plain JavaScript written
// for zbopt, no library.
"use strict";

const ROW = 22;        // px per device row in the Gantt
const MEMORY_ROW = 34; // px per device in the memory timeline
const LEFT = 70;       // px of device labels
const RIGHT = 8;       // px of right margin
const COPY_TOP = ROW - 7; // the copy lanes' strips: device-to-host at COPY_TOP, host-to-device 2 px below
const COMMUNICATION = 4;  // the lane of the iteration's ends: a strip along the row's top edge
const onStrip = (lane) => lane === 1 || lane === 2 || lane === COMMUNICATION;  // drawn thin, over compute

async function unpack(element) {
  const bytes = Uint8Array.from(atob(element.textContent.trim()), (c) => c.charCodeAt(0));
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
  return JSON.parse(await new Response(stream).text());
}

function fit(canvas, height) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.parentElement.clientWidth;
  canvas.style.width = width + "px";
  canvas.style.height = height + "px";
  canvas.width = Math.round(width * ratio);
  canvas.height = Math.round(height * ratio);
  const context = canvas.getContext("2d");
  context.setTransform(ratio, 0, 0, ratio, 0, 0);
  return { context, width, height };
}

function format(value) {
  return Number.isInteger(value) ? String(value) : String(+value.toPrecision(6));
}

class Viewer {
  constructor(section, data) {
    this.data = data;
    this.gantt = section.querySelector("canvas.gantt");
    this.memory = section.querySelector("canvas.memory");
    this.tip = section.querySelector(".tip");
    const end = data.iteration || data.makespan;  // the iteration's ends run past the last op
    this.span = end > 0 ? end : 1;
    this.view = [0, this.span];
    this.byDevice = Array.from({ length: data.devices }, () => []);
    data.ops.d.forEach((device, index) => this.byDevice[device].push(index));
    for (const list of this.byDevice) list.sort((a, b) => data.ops.t0[a] - data.ops.t0[b]);
    this.highest = 0;  // the memory axis: the highest level or limit (a loop: spreading 100k levels overflows)
    for (const [, levels] of data.memory) for (const level of levels) this.highest = Math.max(this.highest, level);
    for (const limit of data.limit || []) this.highest = Math.max(this.highest, limit);
    this.highest = this.highest || 1;
    this.pending = false;
    for (const canvas of [this.gantt, this.memory]) this.listen(canvas);
    this.resize();
  }

  resize() {  // the canvases' size follows the page's; then a full redraw
    this.ganttSize = fit(this.gantt, this.data.devices * ROW + 20);
    this.memorySize = fit(this.memory, this.data.devices * MEMORY_ROW + 4);
    this.draw();
  }

  redraw() {  // at most one redraw per frame while dragging or zooming
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => { this.pending = false; this.draw(); });
  }

  x(time, width) {
    return LEFT + ((time - this.view[0]) / (this.view[1] - this.view[0])) * (width - LEFT - RIGHT);
  }

  time(x, width) {
    return this.view[0] + ((x - LEFT) / (width - LEFT - RIGHT)) * (this.view[1] - this.view[0]);
  }

  band(index) {  // [top offset, height] of an op's box within its device row
    const { lane, part, parts } = this.data.ops;
    if (lane[index] === 1 || lane[index] === 2) return [COPY_TOP + 2 * (lane[index] - 1), 2];
    if (lane[index] === COMMUNICATION) return [0, 3];  // a re-gather, on the strip of the unshards
    if (lane[index] === 3) return [2 + (part[index] * (ROW - 4)) / parts[index], (ROW - 4) / parts[index]];
    return [2, ROW - 4];
  }

  draw() {
    const { ops, palette, devices } = this.data;
    const { context, width, height } = this.ganttSize;
    context.clearRect(0, 0, width, height);
    context.font = "11px system-ui, sans-serif";
    const digit = context.measureText("0").width;
    for (let device = 0; device < devices; device++) {
      const top = device * ROW;
      context.fillStyle = "#ececec";
      context.fillRect(LEFT, top + 2, width - LEFT - RIGHT, ROW - 4);
      context.fillStyle = "#1a1a1a";
      context.fillText("device " + device, 4, top + ROW / 2 + 4);
      for (const strips of [false, true]) {  // the strips last, over the compute boxes
        for (const index of this.byDevice[device]) {
          const lane = ops.lane[index];  // 0 compute, 1 and 2 the copy lanes, 3 a pair's members, 4 a re-gather
          if (onStrip(lane) !== strips) continue;
          const left = this.x(ops.t0[index], width), right = this.x(ops.t1[index], width);
          if (right < LEFT || left > width - RIGHT) continue;
          const [offset, size] = this.band(index);
          const from = Math.max(left, LEFT), span = Math.min(right, width - RIGHT) - from;
          context.fillStyle = palette[ops.c[index]];
          context.fillRect(from, top + offset, Math.max(1, span - 0.5), size);
          const label = String(ops.j[index]);
          if (lane === 0 && span > label.length * digit + 6) {  // the microbatch, where it fits
            context.fillStyle = ops.chunk[index] === this.data.chunks - 1 ? "#ffffff" : "#1a1a1a";
            context.fillText(label, from + (span - label.length * digit) / 2, top + ROW / 2 + 4);
          }
        }
      }
      this.drawEnds(context, device, top, width);
    }
    context.fillStyle = "#1a1a1a";
    context.fillText(format(this.view[0]), LEFT, devices * ROW + 14);
    const end = format(this.view[1]);
    context.fillText(end, width - RIGHT - context.measureText(end).width, devices * ROW + 14);
    this.drawMemory();
  }

  endBand(index) {  // [top offset, height] of an iteration's end: the top strip, or (a step) the compute box
    return this.data.ends.lane[index] === COMMUNICATION ? [0, 3] : [2, ROW - 4];
  }

  drawEnds(context, device, top, width) {  // unshards and reductions on the strip, the step on compute
    const ends = this.data.ends;
    if (!ends) return;
    ends.d.forEach((owner, index) => {
      if (owner !== device) return;
      const left = Math.max(this.x(ends.t0[index], width), LEFT);
      const right = Math.min(this.x(ends.t1[index], width), width - RIGHT);
      if (right <= left) return;
      const [offset, size] = this.endBand(index);
      context.fillStyle = ends.colour[index];
      context.fillRect(left, top + offset, Math.max(1, right - left - 0.5), size);
    });
  }

  endAt(x, y) {  // the iteration's end under (x, y), or null
    const ends = this.data.ends, device = Math.floor(y / ROW);
    if (!ends) return null;
    const time = this.time(x, this.gantt.clientWidth), within = y - device * ROW;
    const index = ends.d.findIndex((owner, i) => owner === device && ends.t0[i] <= time && time < ends.t1[i] &&
      within >= this.endBand(i)[0] - 1 && within < this.endBand(i)[0] + this.endBand(i)[1] + 1);
    return index < 0 ? null : index;
  }

  drawMemory() {
    const { memory, devices, limit } = this.data;
    const { context, width, height } = this.memorySize;
    context.clearRect(0, 0, width, height);
    context.font = "11px system-ui, sans-serif";
    for (let device = 0; device < devices; device++) {
      const base = (device + 1) * MEMORY_ROW, scale = (MEMORY_ROW - 6) / this.highest;
      const [times, levels] = memory[device];
      context.fillStyle = "#1a1a1a";
      context.fillText("device " + device, 4, base - MEMORY_ROW / 2 + 4);
      if (limit) {
        context.strokeStyle = "#c0392b";
        context.beginPath();
        context.moveTo(LEFT, base - limit[device] * scale);
        context.lineTo(width - RIGHT, base - limit[device] * scale);
        context.stroke();
      }
      context.strokeStyle = "#3b6fb6";
      context.beginPath();
      let level = 0;
      context.moveTo(LEFT, base);
      times.forEach((time, step) => {
        const x = Math.min(Math.max(this.x(time, width), LEFT), width - RIGHT);
        context.lineTo(x, base - level * scale);
        level = levels[step];
        context.lineTo(x, base - level * scale);
      });
      context.lineTo(width - RIGHT, base - level * scale);
      context.stroke();
    }
  }

  opAt(x, y) {  // the op whose box is under (x, y): its device's row, its time and its band in the row
    const device = Math.floor(y / ROW);
    if (device < 0 || device >= this.data.devices) return null;
    const time = this.time(x, this.gantt.clientWidth), within = y - device * ROW, { t0, t1, lane } = this.data.ops;
    let found = null;
    for (const index of this.byDevice[device]) {
      if (t0[index] > time) break;
      if (time >= t1[index]) continue;
      const [offset, size] = this.band(index), strip = onStrip(lane[index]);
      if (strip ? within >= offset - 1 && within < offset + size + 1 : within >= offset && within < offset + size) {
        found = index;
        if (strip) break;  // a strip lies over the compute box
      }
    }
    return found;
  }

  tokens(microbatch) {  // " (512 tokens)" where the problem gives each microbatch's tokens
    const tokens = this.data.tokens;
    return tokens ? ` (${tokens[microbatch % tokens.length]} tokens)` : "";
  }

  describe(canvas, x, y) {
    if (canvas === this.gantt) {
      const end = this.endAt(x, y);
      if (end !== null) {
        const ends = this.data.ends, [ms] = this.units();
        return `${ends.name[end]} · ${ends.what[end]} · device ${ends.d[end]} · start ${format(ends.t0[end])}${ms} · ` +
          `end ${format(ends.t1[end])}${ms}`;
      }
      const index = this.opAt(x, y);
      if (index === null) return null;
      const { ops, kinds } = this.data, [ms, gb] = this.units();
      return `${ops.name[index]} · ${kinds[ops.k[index]]} · stage ${ops.s[index]} (chunk ${ops.chunk[index]}) · ` +
        `microbatch ${ops.j[index]}${this.tokens(ops.j[index])} · start ${format(ops.t0[index])}${ms} · end ${format(ops.t1[index])}${ms} · ` +
        `memory after ${format(ops.m[index])}${gb}`;
    }
    const device = Math.floor(y / MEMORY_ROW);
    if (device < 0 || device >= this.data.devices) return null;
    const time = this.time(x, canvas.clientWidth), [times, levels] = this.data.memory[device];
    let level = 0;
    times.forEach((moment, step) => { if (moment <= time) level = levels[step]; });
    const [ms, gb] = this.units();
    return `device ${device} · t ${format(time)}${ms} · holds ${format(level)}${gb}`;
  }

  units() {  // " ms", " GB" after a model's numbers (a plan's); nothing for a bare problem's own units
    const units = this.data.units || {};
    return [units.time ? " " + units.time : "", units.memory ? " " + units.memory : ""];
  }

  listen(canvas) {
    let drag = null;
    canvas.addEventListener("mousemove", (event) => {
      const x = event.offsetX, y = event.offsetY;
      if (drag !== null) {
        const shift = this.time(drag, canvas.clientWidth) - this.time(x, canvas.clientWidth);
        this.view = [this.view[0] + shift, this.view[1] + shift];
        drag = x;
        this.tip.hidden = true;
        this.redraw();
        return;
      }
      const text = x > LEFT ? this.describe(canvas, x, y) : null;
      this.tip.hidden = text === null;
      if (text !== null) {
        this.tip.textContent = text;
        this.tip.style.left = event.pageX + 12 + "px";
        this.tip.style.top = event.pageY + 12 + "px";
      }
    });
    canvas.addEventListener("mouseleave", () => { this.tip.hidden = true; drag = null; });
    canvas.addEventListener("mousedown", (event) => { drag = event.offsetX; });
    canvas.addEventListener("mouseup", () => { drag = null; });
    canvas.addEventListener("dblclick", () => { this.view = [0, this.span]; this.draw(); });
    canvas.addEventListener("wheel", (event) => {
      if (!(event.ctrlKey || event.metaKey) || event.deltaY === 0) return;  // a plain wheel scrolls the page
      event.preventDefault();
      const at = this.time(event.offsetX, canvas.clientWidth), factor = Math.exp(event.deltaY * 0.0015);
      const span = Math.max((this.view[1] - this.view[0]) * factor, this.span * 1e-9);
      const share = (at - this.view[0]) / (this.view[1] - this.view[0]);
      this.view = [at - share * span, at + (1 - share) * span];
      this.redraw();
    }, { passive: false });
  }
}

const viewers = new Map();

async function show(name, scroll) {
  for (const section of document.querySelectorAll("section.schedule")) {
    section.hidden = section.dataset.schedule !== name;
  }
  for (const row of document.querySelectorAll("table.comparison tr[data-schedule]")) {
    row.classList.toggle("shown", row.dataset.schedule === name);
  }
  const section = document.querySelector(`section.schedule[data-schedule="${CSS.escape(name)}"]`);
  if (scroll) section.scrollIntoView();
  if (!viewers.has(name)) {  // the promise, at once: a second click while unpacking makes no second viewer
    viewers.set(name, unpack(section.querySelector("script.schedule-data")).then((data) => new Viewer(section, data)));
  }
  try {
    (await viewers.get(name)).resize();  // it was hidden: its canvases had no width
  } catch (error) {
    section.querySelector(".tip").hidden = false;
    section.querySelector(".tip").textContent = "this browser cannot draw the chart: " + error;
    throw error;
  }
  document.body.dataset.shown = name;  // for tests: the viewer of this schedule is drawn
}

for (const row of document.querySelectorAll("table.comparison tr[data-schedule]")) {
  row.addEventListener("click", (event) => { event.preventDefault(); show(row.dataset.schedule, true); });
}
window.addEventListener("resize", async () => {
  const shown = document.body.dataset.shown;
  if (shown && viewers.has(shown)) (await viewers.get(shown)).resize();
});
// the table's first row, or the page's only schedule (a plan's report has no comparison table)
const first = document.querySelector("table.comparison tr[data-schedule]") || document.querySelector("section.schedule");
if (first) show(first.dataset.schedule, false);

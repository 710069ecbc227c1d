// zbopt's report viewer: each schedule's Gantt chart and memory timeline drawn on canvases from the
// data the report embeds (gzip, base64: DecompressionStream unpacks it), with hover details, zoom
// (wheel, around the pointer), pan (drag) and reset (double click); a click on a row of the
// comparison table shows that schedule. Plain JavaScript written for zbopt, no library.
"use strict";

const ROW = 22;        // px per device row in the Gantt
const MEMORY_ROW = 34; // px per device in the memory timeline
const LEFT = 70;       // px of device labels

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
    this.view = [0, data.makespan];
    this.byDevice = Array.from({ length: data.devices }, () => []);
    data.ops.d.forEach((device, index) => this.byDevice[device].push(index));
    for (const list of this.byDevice) list.sort((a, b) => data.ops.t0[a] - data.ops.t0[b]);
    for (const canvas of [this.gantt, this.memory]) this.listen(canvas);
    this.draw();
  }

  x(time, width) {
    return LEFT + ((time - this.view[0]) / (this.view[1] - this.view[0])) * (width - LEFT - 8);
  }

  time(x, width) {
    return this.view[0] + ((x - LEFT) / (width - LEFT - 8)) * (this.view[1] - this.view[0]);
  }

  draw() {
    const { ops, palette, devices } = this.data;
    const { context, width, height } = fit(this.gantt, devices * ROW + 20);
    context.clearRect(0, 0, width, height);
    context.font = "11px system-ui, sans-serif";
    for (let device = 0; device < devices; device++) {
      const top = device * ROW;
      context.fillStyle = "#ececec";
      context.fillRect(LEFT, top + 2, width - LEFT - 8, ROW - 4);
      context.fillStyle = "#1a1a1a";
      context.fillText("device " + device, 4, top + ROW / 2 + 4);
      for (const index of this.byDevice[device]) {
        const left = this.x(ops.t0[index], width), right = this.x(ops.t1[index], width);
        if (right < LEFT || left > width) continue;
        const lane = ops.lane[index];  // 0 compute, 1 and 2 the copy lanes, 3 a pair's members
        const [offset, size] = lane === 0 ? [2, ROW - 4] : lane === 3 ? [2 + (ops.part[index] * (ROW - 4)) / ops.parts[index], (ROW - 4) / ops.parts[index]] : [ROW - 7 + 2 * (lane - 1), 2];
        const from = Math.max(left, LEFT), span = Math.min(right, width) - from;
        context.fillStyle = palette[ops.c[index]];
        context.fillRect(from, top + offset, Math.max(1, span - 0.5), size);
        const label = String(ops.j[index]);
        if (lane === 0 && span > context.measureText(label).width + 6) {  // the microbatch, where it fits
          context.fillStyle = ops.chunk[index] === this.data.chunks - 1 ? "#ffffff" : "#1a1a1a";
          context.fillText(label, from + (span - context.measureText(label).width) / 2, top + ROW / 2 + 4);
        }
      }
    }
    context.fillStyle = "#1a1a1a";
    context.fillText(format(this.view[0]), LEFT, devices * ROW + 14);
    const end = format(this.view[1]);
    context.fillText(end, width - 8 - context.measureText(end).width, devices * ROW + 14);
    this.drawMemory();
  }

  drawMemory() {
    const { memory, devices, limit } = this.data;
    const { context, width, height } = fit(this.memory, devices * MEMORY_ROW + 4);
    context.clearRect(0, 0, width, height);
    context.font = "11px system-ui, sans-serif";
    const top = Math.max(...memory.map(([, levels]) => Math.max(...levels)), ...(limit || [0])) || 1;
    for (let device = 0; device < devices; device++) {
      const base = (device + 1) * MEMORY_ROW, scale = (MEMORY_ROW - 6) / top;
      const [times, levels] = memory[device];
      context.fillStyle = "#1a1a1a";
      context.fillText("device " + device, 4, base - MEMORY_ROW / 2 + 4);
      if (limit) {
        context.strokeStyle = "#c0392b";
        context.beginPath();
        context.moveTo(LEFT, base - limit[device] * scale);
        context.lineTo(width - 8, base - limit[device] * scale);
        context.stroke();
      }
      context.strokeStyle = "#3b6fb6";
      context.beginPath();
      let level = 0;
      context.moveTo(LEFT, base);
      times.forEach((time, step) => {
        const x = Math.min(Math.max(this.x(time, width), LEFT), width - 8);
        context.lineTo(x, base - level * scale);
        level = levels[step];
        context.lineTo(x, base - level * scale);
      });
      context.lineTo(width - 8, base - level * scale);
      context.stroke();
    }
  }

  opAt(x, y) {
    const device = Math.floor(y / ROW);
    if (device < 0 || device >= this.data.devices) return null;
    const time = this.time(x, this.gantt.clientWidth), { t0, t1 } = this.data.ops;
    const hits = this.byDevice[device].filter((index) => t0[index] <= time && time < t1[index]);
    return hits.length ? hits[0] : null;
  }

  describe(canvas, x, y) {
    if (canvas === this.gantt) {
      const index = this.opAt(x, y);
      if (index === null) return null;
      const { ops, kinds } = this.data;
      return `${ops.name[index]} · ${kinds[ops.k[index]]} · stage ${ops.s[index]} (chunk ${ops.chunk[index]}) · ` +
        `microbatch ${ops.j[index]} · start ${format(ops.t0[index])} · end ${format(ops.t1[index])} · ` +
        `memory after ${format(ops.m[index])}`;
    }
    const device = Math.floor(y / MEMORY_ROW);
    if (device < 0 || device >= this.data.devices) return null;
    const time = this.time(x, canvas.clientWidth), [times, levels] = this.data.memory[device];
    let level = 0;
    times.forEach((moment, step) => { if (moment <= time) level = levels[step]; });
    return `device ${device} · t ${format(time)} · holds ${format(level)}`;
  }

  listen(canvas) {
    let drag = null;
    canvas.addEventListener("mousemove", (event) => {
      const x = event.offsetX, y = event.offsetY;
      if (drag !== null) {
        const shift = this.time(drag, canvas.clientWidth) - this.time(x, canvas.clientWidth);
        this.view = [this.view[0] + shift, this.view[1] + shift];
        drag = x;
        this.draw();
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
    canvas.addEventListener("dblclick", () => { this.view = [0, this.data.makespan]; this.draw(); });
    canvas.addEventListener("wheel", (event) => {
      event.preventDefault();
      const at = this.time(event.offsetX, canvas.clientWidth), factor = event.deltaY > 0 ? 1.25 : 0.8;
      this.view = [at - (at - this.view[0]) * factor, at + (this.view[1] - at) * factor];
      this.draw();
    }, { passive: false });
  }
}

const viewers = new Map();

async function show(name) {
  for (const section of document.querySelectorAll("section.schedule")) {
    section.hidden = section.dataset.schedule !== name;
  }
  for (const row of document.querySelectorAll("table.comparison tr[data-schedule]")) {
    row.classList.toggle("shown", row.dataset.schedule === name);
  }
  const section = document.querySelector(`section.schedule[data-schedule="${CSS.escape(name)}"]`);
  if (!viewers.has(name)) {
    viewers.set(name, new Viewer(section, await unpack(section.querySelector("script.schedule-data"))));
  } else {
    viewers.get(name).draw();
  }
  document.body.dataset.shown = name;  // for tests: the viewer of this schedule is drawn
}

for (const row of document.querySelectorAll("table.comparison tr[data-schedule]")) {
  row.addEventListener("click", (event) => { event.preventDefault(); show(row.dataset.schedule); });
}
window.addEventListener("resize", () => { for (const viewer of viewers.values()) viewer.draw(); });
const first = document.querySelector("table.comparison tr[data-schedule]");
if (first) show(first.dataset.schedule);

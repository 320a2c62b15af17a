'use strict';
// Numbers and tables for the benchmark: medians over rounds, percentiles of
// per-hit latencies, and one Markdown table per scenario.

function sorted(values) {
  return Float64Array.from(values).sort();
}

/** The q-quantile (0..1) of already sorted values, nearest rank. */
function quantile(sortedValues, q) {
  if (sortedValues.length === 0) return NaN;
  const rank = Math.min(sortedValues.length - 1, Math.max(0, Math.ceil(q * sortedValues.length) - 1));
  return sortedValues[rank];
}

function median(values) {
  return quantile(sorted(values), 0.5);
}

/** median, min and max of one measure over the rounds. */
function summary(values) {
  const s = sorted(values);
  return { median: quantile(s, 0.5), min: s[0], max: s[s.length - 1], rounds: s.length };
}

function format(value, unit) {
  if (!Number.isFinite(value)) return '-';
  if (unit === 'ops/s') return Math.round(value).toLocaleString('en-US');
  if (unit === 'B') return value.toFixed(1);
  if (unit === 'cores') return value.toFixed(2);
  if (unit === 'ratio') return value === 0 ? '0' : value < 0.01 ? value.toPrecision(2) : value.toFixed(3);
  if (unit === 'us')
    return value < 10 ? value.toFixed(2) : value < 1000 ? value.toFixed(1) : Math.round(value).toLocaleString('en-US');
  return String(value);
}

/** The best JS peer's median of `measure`: highest when `higherIsBetter`, else lowest. */
function bestPeer({ higherIsBetter, rows }, measure) {
  const peers = rows.filter((row) => row.peer && row.values[measure]);
  const pick = higherIsBetter ? Math.max : Math.min;
  const best = peers.length ? pick(...peers.map((row) => row.values[measure].median)) : NaN;
  const bestName = peers.find((row) => row.values[measure].median === best)?.store ?? 'none';
  return { best, bestName };
}

/**
 * A Markdown table. `rows` are { store, peer, values: {column: summary|number}, note };
 * the ratio column compares `ratioOf` with the best JS peer (`peer: true`), best
 * meaning highest when `higherIsBetter`, else lowest; `peerIs` names the peer
 * rows when they are not JS stores. `limit` names a row (a server's own load tool) that a second
 * ratio column compares `ratioOf` with.
 */
function table({ title, unit, higherIsBetter, ratioOf, columns, rows, peerIs = 'the best JS peer', limit }) {
  const { best, bestName } = bestPeer({ higherIsBetter, rows }, ratioOf);
  const header = ['store'];
  for (const column of columns) {
    header.push(column.range ? `${column.name} (median)` : column.name);
    if (column.range) header.push('min-max');
  }
  header.push(`ratio (${ratioOf})`);
  const limitValue = limit && rows.find((row) => row.store === limit)?.values[ratioOf]?.median;
  if (limit) header.push(`of the limit (${ratioOf})`);
  const lines = [
    `### ${title}`,
    '',
    `Unit: ${unit}. Ratio: this store's ${ratioOf} over ${peerIs}'s (${bestName}); ` +
      `${higherIsBetter ? 'higher' : 'lower'} is better.` +
      (limit ? ` Of the limit: the same over the row "${limit}".` : ''),
    '',
    `| ${header.join(' | ')} |`,
    `|${header.map((_, i) => (i === 0 ? ' --- ' : ' ---: ')).join('|')}|`,
  ];
  for (const row of rows) {
    const cells = [row.store];
    for (const [i, column] of columns.entries()) {
      const value = row.values[column.name];
      if (value === undefined) {
        cells.push('-');
        if (column.range) cells.push('');
        continue;
      }
      const s = typeof value === 'number' ? { median: value, min: value, max: value } : value;
      cells.push(format(s.median, column.unit ?? unit));
      if (column.range) cells.push(`${format(s.min, column.unit ?? unit)}-${format(s.max, column.unit ?? unit)}`);
    }
    const mine = row.values[ratioOf];
    // A ratio to a best or limit of 0 (a smoke run's tiny footprint can grow no RSS at all) says nothing.
    const ratio = (of) => {
      if (!mine || !Number.isFinite(of)) return '';
      return of === 0 ? '-' : `${(mine.median / of).toFixed(2)}x`;
    };
    cells.push(ratio(best));
    if (limit) cells.push(ratio(limitValue));
    lines.push(`| ${cells.join(' | ')} |`);
  }
  return lines.join('\n');
}

/** The entries in the order of round `round`: each round starts one further along, so no store always goes first. */
function rotated(entries, round) {
  return entries.map((_, i) => entries[(i + round) % entries.length]);
}

module.exports = { sorted, quantile, median, summary, bestPeer, table, rotated };

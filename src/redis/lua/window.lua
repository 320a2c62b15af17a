-- The fixed-window rules of window.rs, run atomically by Redis for one hit.
-- KEYS[1]: the counter (a plain integer string with a PTTL, as the JS
-- reference store keeps it). ARGV[1]: windowMs, ARGV[2]: amount (integers,
-- in the canonical decimal form ratestore writes: "0" is the only zero).
-- Returns { count, resetMs }. Lua numbers are doubles: counts stay within
-- ±(2^53 - 1), and a hit that would leave that range changes nothing.
--
-- The open window's hit, the hot path, costs the server what seed 000's
-- INCRBY-then-PTTL script does (benchmark/RESULTS.md): two calls, no
-- closure, no number conversion; the checks only compare.
local key, window_ms, amount = KEYS[1], ARGV[1], ARGV[2]

local pttl = redis.call('PTTL', key)
if pttl >= 1 then
  if amount ~= '0' then
    local count = redis.call('INCRBY', key, amount)
    if count > 9007199254740991 or count < -9007199254740991 then
      redis.call('DECRBY', key, amount)
      error({ err = 'COUNTRANGE the count would leave the safe-integer range' })
    end
    return { count, pttl }
  end
  -- A read: only of a counter, never answering 0 for other data under this name, nor a count
  -- past the range (another client's INCRBY may have put it there) rounded.
  local count = tonumber(redis.call('GET', key))
  if count == nil or count % 1 ~= 0 then
    error({ err = 'NOTCOUNTER the key holds a value that is not an integer counter' })
  end
  if count > 9007199254740991 or count < -9007199254740991 then
    error({ err = 'COUNTRANGE the count would leave the safe-integer range' })
  end
  return { count, pttl }
end

-- No open window: no key, a key without a TTL, or under 1 ms left.
if pttl == -1 then
  -- Restart (or read as 0) only a counter: never overwrite other data under this name.
  local count = tonumber(redis.call('GET', key))
  if count == nil or count % 1 ~= 0 then
    error({ err = 'NOTCOUNTER the key holds a value that is not an integer counter' })
  end
end
if amount == '0' then
  return { 0, tonumber(window_ms) }
end
redis.call('SET', key, amount, 'PX', window_ms)
return { tonumber(amount), tonumber(window_ms) }

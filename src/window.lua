-- The fixed-window rules of window.rs, run atomically by Redis for one hit.
-- KEYS[1]: the counter (a plain integer string with a PTTL, as the JS
-- reference store keeps it). ARGV[1]: windowMs, ARGV[2]: amount (integers).
-- Returns { count, resetMs }. Lua numbers are doubles: counts stay within
-- ±(2^53 - 1), and a hit that would leave that range changes nothing.
local MAX_SAFE = 9007199254740991
local key, window_ms, amount = KEYS[1], ARGV[1], tonumber(ARGV[2])

local function stored_count()
  local count = tonumber(redis.call('GET', key))
  if count == nil or count % 1 ~= 0 then
    error({ err = 'NOTCOUNTER the key holds a value that is not an integer counter' })
  end
  return count
end

local pttl = redis.call('PTTL', key)
if pttl < 1 then
  -- No open window: no key, a key without a TTL, or under 1 ms left.
  if pttl == -1 then
    -- Restart (or read as 0) only a counter: never overwrite other data
    -- under this name, nor answer 0 for it.
    stored_count()
  end
  if amount == 0 then
    return { 0, tonumber(window_ms) }
  end
  redis.call('SET', key, ARGV[2], 'PX', window_ms)
  return { amount, tonumber(window_ms) }
end

local count
if amount == 0 then
  count = stored_count()
else
  count = redis.call('INCRBY', key, ARGV[2])
end
if count > MAX_SAFE or count < -MAX_SAFE then
  if amount ~= 0 then
    redis.call('DECRBY', key, ARGV[2])
  end
  error({ err = 'COUNTRANGE the count would leave the safe-integer range' })
end
return { count, pttl }

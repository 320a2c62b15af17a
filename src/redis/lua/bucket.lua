-- The token bucket of bucket.rs, run atomically by Redis on its own clock (TIME).
-- KEYS[1]: the state, a hash { tokens, at (µs of the last refill) } with a
-- PTTL until the bucket is full again (no state is a full bucket).
-- ARGV[1]: capacity, ARGV[2]: refill, ARGV[3]: intervalMs (positive integers),
-- ARGV[4]: cost (an integer, 0 or more).
-- Returns { allowed (1 or 0), remaining, retryMs, resetMs }. A refused take,
-- or one of cost 0, writes nothing. Every number is an integer below 2^53.
local key = KEYS[1]
local capacity, refill = tonumber(ARGV[1]), tonumber(ARGV[2])
local interval = tonumber(ARGV[3]) * 1000
local cost = tonumber(ARGV[4])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])

local function int(n)
  -- Redis would print a large double in exponent form.
  return string.format('%.0f', n)
end

local function ceil_div(a, b)
  local rest = math.fmod(a, b)
  return (a - rest) / b + (rest > 0 and 1 or 0)
end

local function ms_until(t)
  if t <= now then
    return 0
  end
  return ceil_div(t - now, 1000)
end

local function whole(value)
  local n = tonumber(value)
  if n == nil or n % 1 ~= 0 or n < 0 then
    error({ err = 'NOTSTATE the key holds data that is not a token bucket' })
  end
  return n
end

local tokens, at = capacity, now
local stored = redis.call('HMGET', key, 'tokens', 'at')
if stored[1] or stored[2] or redis.call('EXISTS', key) == 1 then
  local t, a = whole(stored[1]), whole(stored[2])
  local missing = capacity - t
  if missing > 0 then
    -- A clock set back refills nothing until it passes `at` again.
    local refills = 0
    if now > a then
      refills = (now - a - math.fmod(now - a, interval)) / interval
    end
    if refills < ceil_div(missing, refill) then
      tokens, at = t + refills * refill, a + refills * interval
    end
  end
end

local function holds_at(have, want)
  return at + ceil_div(math.max(want - have, 0), refill) * interval
end

if cost <= tokens then
  local remaining = tokens - cost
  local ends = holds_at(remaining, capacity)
  if cost > 0 then
    redis.call('HSET', key, 'tokens', int(remaining), 'at', int(at))
    -- A ms more than it counts: Redis times the expiry from the ms the script
    -- started in, which may be up to 1 ms before TIME's now.
    redis.call('PEXPIRE', key, int(ms_until(ends) + 1))
  end
  return { 1, remaining, 0, ms_until(ends) }
end
local reset_ms = ms_until(holds_at(tokens, capacity))
local retry_ms
if cost > capacity then
  retry_ms = math.max(reset_ms, 1)
else
  retry_ms = ms_until(holds_at(tokens, cost))
end
return { 0, tokens, retry_ms, reset_ms }

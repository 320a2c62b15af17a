-- The sliding window of sliding.rs, run atomically by Redis on its own clock
-- (TIME), so that app instances with skewed clocks agree.
-- KEYS[1]: the state, a hash { start (µs), previous, current } with a PTTL.
-- ARGV[1]: the operation, ARGV[2]: windowMs, ARGV[3]: amount or cost
-- (integers, 0 or more), ARGV[4]: limit (consume), or the window a decrement
-- gives back to (0: none named).
--   'increment' -> { count, resetMs, window }  adds with no limit; 0 reads
--   'decrement' -> { count, resetMs, window }  takes back, never below 0
--   'consume'   -> { allowed (1 or 0), count, remaining, resetMs, retryMs, window }
-- window: the current window's end in µs, its id. Every number is an integer
-- below 2^53, so Lua's doubles hold it exactly; the one product that may not
-- be (a count times µs) goes through muldiv.
local MAX_SAFE = 9007199254740991
local key, op = KEYS[1], ARGV[1]
local window = tonumber(ARGV[2]) * 1000
local amount = tonumber(ARGV[3])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])

local function int(n)
  -- Redis would print a large double in exponent form.
  return string.format('%.0f', n)
end

local function ceil_ms(us)
  local rest = math.fmod(us, 1000)
  return (us - rest) / 1000 + (rest > 0 and 1 or 0)
end

-- BEGIN muldiv (tests/sliding_twin.rs runs this function on its own)
local TWO_53 = 9007199254740992
-- floor(a * b / d) and the remainder, exactly, for integers 0 <= a < d < 2^53
-- and 0 <= b < 2^53. A product below 2^53 is exact as it is; a larger one is
-- multiplied out by b's bits, highest first, keeping q * d + r = a * (the bits
-- so far) with r < d: every number on the way is an integer below 2^54 that
-- is even or below 2^53, so each double is exact.
local function muldiv(a, b, d)
  local p = a * b
  if p < TWO_53 then
    local r = math.fmod(p, d)
    return (p - r) / d, r
  end
  local bit = 1
  while bit * 2 <= b do
    bit = bit * 2
  end
  local q, r = 0, 0
  while bit >= 1 do
    q, r = q * 2, r * 2
    if r >= d then
      q, r = q + 1, r - d
    end
    if b >= bit then
      b = b - bit
      -- r + a might pass 2^53: compare against d - a instead.
      if r >= d - a then
        q, r = q + 1, r - (d - a)
      else
        r = r + a
      end
    end
    bit = bit / 2
  end
  return q, r
end
-- END muldiv

-- ceil(count * left / window): the previous window's share, rounded up.
local function weighted(count, left)
  if left >= window then
    return count
  end
  local q, r = muldiv(left, count, window)
  return q + (r > 0 and 1 or 0)
end

local function whole(value)
  local n = tonumber(value)
  if n == nil or n % 1 ~= 0 or n < 0 then
    error({ err = 'NOTSTATE the key holds data that is not a sliding window' })
  end
  return n
end

local start = now - math.fmod(now, window)
local left = window - math.fmod(now, window)
local previous, current = 0, 0
local stored = redis.call('HMGET', key, 'start', 'previous', 'current')
if stored[1] or stored[2] or stored[3] or redis.call('EXISTS', key) == 1 then
  local s, p, c = whole(stored[1]), whole(stored[2]), whole(stored[3])
  if s >= start then
    -- A start ahead of the clock (the server's clock set back) counts in full.
    start, previous, current = s, p, c
  elseif s + window == start then
    previous = c
  end
end

local function save()
  if previous == 0 and current == 0 then
    redis.call('DEL', key)
    return
  end
  local ends = start + (current > 0 and 2 or 1) * window
  redis.call('HSET', key, 'start', int(start), 'previous', int(previous), 'current', int(current))
  -- A ms more than it counts: Redis times the expiry from the ms the script
  -- started in, which may be up to 1 ms before TIME's now.
  redis.call('PEXPIRE', key, int(ceil_ms(ends - now) + 1))
end

local function latest(count, room, most)
  -- The largest left in 0..most at which count, weighted, is at most room:
  -- count * left <= room * window.
  if room >= count then
    return most
  end
  return math.min(most, (muldiv(room, window, count)))
end

local estimate = weighted(previous, left) + current
local reset_ms = ceil_ms(left)

if op == 'increment' then
  if estimate + amount > MAX_SAFE then
    error({ err = 'COUNTRANGE the count would leave the safe-integer range' })
  end
  if amount > 0 then
    current = current + amount
    save()
  end
  return { estimate + amount, reset_ms, start + window }
elseif op == 'decrement' then
  -- Named a window: only to it (the current one, or the previous one once the
  -- clock moved a window on); any other window gets nothing.
  local taken_in = tonumber(ARGV[4]) or 0
  local from_current, from_previous = 0, 0
  if taken_in == 0 then
    from_current = math.min(amount, current)
    from_previous = math.min(amount - from_current, previous)
  elseif taken_in == start + window then
    from_current = math.min(amount, current)
  elseif taken_in == start then
    from_previous = math.min(amount, previous)
  end
  if from_current + from_previous > 0 then
    current, previous = current - from_current, previous - from_previous
    save()
  end
  return { weighted(previous, left) + current, reset_ms, start + window }
elseif op == 'consume' then
  local limit = tonumber(ARGV[4])
  if estimate + amount <= limit then
    if amount > 0 then
      current = current + amount
      save()
    end
    estimate = estimate + amount
    return { 1, estimate, math.max(0, math.min(limit, limit - estimate)), reset_ms, 0, start + window }
  end
  local retry_ms
  if amount > limit then
    retry_ms = current > 0 and ceil_ms(left + window) or reset_ms
  elseif current + amount <= limit then
    retry_ms = ceil_ms(left - latest(previous, limit - amount - current, left - 1))
  else
    retry_ms = ceil_ms(left + window - latest(current, limit - amount, window))
  end
  return { 0, estimate, math.max(0, math.min(limit, limit - estimate)), reset_ms, retry_ms, start + window }
end
error({ err = 'ERR unknown sliding-window operation' })

-- The limit-aware consume of window.rs, run atomically by Redis. Same counter
-- as window.lua (a plain integer string with a PTTL), so hit and consume agree.
-- KEYS[1]: the counter. ARGV[1]: windowMs, ARGV[2]: limit, ARGV[3]: cost
-- (integers, limit and cost 0 or more). Returns { allowed (1 or 0), count,
-- remaining, resetMs, window }. A refused consume, or one of cost 0, writes
-- nothing. window: the open window's id, its expiry in epoch ms (PEXPIRETIME,
-- which stays put while the window is open); 0 when none is open.
local key, window_ms = KEYS[1], tonumber(ARGV[1])
local limit, cost = tonumber(ARGV[2]), tonumber(ARGV[3])

local function stored_count()
  local count = tonumber(redis.call('GET', key))
  if count == nil or count % 1 ~= 0 then
    error({ err = 'NOTCOUNTER the key holds a value that is not an integer counter' })
  end
  return count
end

local pttl = redis.call('PTTL', key)
local count, reset_ms = 0, window_ms
if pttl >= 1 then
  count, reset_ms = stored_count(), pttl
elseif pttl == -1 then
  -- An ended counter with no TTL: read as 0, but never other data.
  stored_count()
end

local allowed = count + cost <= limit
if allowed and cost > 0 then
  if pttl >= 1 then
    count = redis.call('INCRBY', key, ARGV[3])
  else
    redis.call('SET', key, ARGV[3], 'PX', ARGV[1])
    count = cost
  end
end
local window = 0
if pttl >= 1 or (allowed and cost > 0) then
  window = redis.call('PEXPIRETIME', key)
end
return { allowed and 1 or 0, count, math.max(0, math.min(limit, limit - count)), reset_ms, window }
